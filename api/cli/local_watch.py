"""`meshyard watch -- torchrun ... script.py ARGS`: the service's hang watchdog on a job that
runs outside the service, on this machine. Stdlib and the pure watchdog modules only.

    watch = LocalWatch(argv, out=Path("meshyard-watch"), policy=Watchdog(stall_timeout_s=10))
    code = watch.run()       # the launcher's exit code, or HANG_EXIT after a hang it ended

How: the launcher runs with `meshyard/_autoprobe` first on PYTHONPATH, so every Python
process it starts with RANK set loads meshyard's probe (meshyard/_probe.py) before the
user's code; the Flight Recorder (TORCH_FR_BUFFER_SIZE) and a per-rank NCCL_DEBUG_FILE are
set unless the caller set them. Every TICK_S the watcher reads each rank's progress file (its
collective seqs) into the service's `HangMonitor` (the same stall rule, thresholds and
straggler probe). On a stall, or when a rank's process is gone while others still run, it asks
every live rank's probe for evidence, runs the same analyzer, prints the report and writes
the evidence directory:

    OUT/report.md, OUT/report.json       the diagnosis
    OUT/fr/rank_<N>                      Flight Recorder dumps (`meshyard diagnose --fr`)
    OUT/logs/launcher.log                the launcher's output (`meshyard diagnose --logs`)
    OUT/diagnostics/<stamp>/rank<N>/     each rank's stacks, dump, probe answer
    OUT/probe/                           the probes' progress and request files

A hang ends the job (SIGTERM to the launcher's process group, SIGKILL after a grace) unless
`observe` is set.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from meshyard._protocol import PROGRESS_SUFFIX
from orchestrator.spec import Watchdog
from orchestrator.watchdog import probe_files
from orchestrator.watchdog.evidence_files import rank_dir, stamp_now
from orchestrator.watchdog.exits import peer_lost
from orchestrator.watchdog.locate import rank_locations
from orchestrator.watchdog.log_elastic import FailureSummary
from orchestrator.watchdog.monitor import HangMonitor
from orchestrator.watchdog.report import DiagnosisReport

TICK_S = 0.25
# Several ranks found gone in one look, none of them with an exit of its own recorded (a
# signal: gloo's abort, and torchrun's SIGTERM to the others right after): wait this long for
# the launcher's failure summary, which names the first failure.
ROOT_CAUSE_WAIT_S = 10.0
# How long the stall rule holds while ranks that entered nothing their cleanly exited peers
# did not are still running (a finished job's last ranks tearing down on a loaded host).
FINISHING_WAIT_S = 30.0
ANSWER_S = 10.0
GRACE_S = 5.0
HANG_EXIT = 3
_CLEAN = "exit code 0"
_KILLED = "its process ended without a clean exit"
_AUTOPROBE = Path(__file__).resolve().parents[2] / "meshyard" / "_autoprobe"


def autoprobe_dir() -> Path:
    """The directory whose sitecustomize starts the probe (from the installed meshyard)."""
    try:
        import meshyard

        return Path(meshyard.__file__).resolve().parent / "_autoprobe"
    except ImportError:  # pragma: no cover - meshyard ships with this package
        return _AUTOPROBE


def world_size_of(argv: Sequence[str]) -> int | None:
    """`--nproc_per_node=N` / `--nproc-per-node N` (x `--nnodes M` when a number) of a
    torchrun command line; None when absent or not a number ("gpu", "auto")."""
    def opt(*names: str) -> str | None:
        for i, a in enumerate(argv):
            for n in names:
                if a == n and i + 1 < len(argv):
                    return argv[i + 1]
                if a.startswith(n + "="):
                    return a.split("=", 1)[1]
        return None

    per = opt("--nproc_per_node", "--nproc-per-node")
    nodes = opt("--nnodes") or "1"
    if per is None or not per.isdigit():
        return None
    return int(per) * (int(nodes) if nodes.isdigit() else 1)


def launcher_env(base: Mapping[str, str], *, out: Path) -> dict[str, str]:
    env = dict(base)
    probe = str(autoprobe_dir())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (probe, env.get("PYTHONPATH", "")) if p)
    env["MESHYARD_PROBE_DIR"] = str(out / "probe")
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(out / "fr" / "timeout_rank_"))
    env.setdefault("NCCL_DEBUG", "WARN")
    env.setdefault("NCCL_DEBUG_FILE", str(out / "nccl" / "%h.%p.log"))
    return env


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class LocalWatch:
    def __init__(self, argv: Sequence[str], *, out: Path, policy: Watchdog,
                 observe: bool = False, echo: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not argv:
            raise ValueError("give the command to watch after `--`, e.g. "
                             "`meshyard watch -- torchrun --nproc_per_node=2 train.py`")
        self.argv, self.out, self.policy, self.observe = list(argv), out.absolute(), policy, observe
        self.echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
        self.clock = clock
        self.reports: list[DiagnosisReport] = []
        self.host = socket.gethostname()
        self._world = world_size_of(argv)
        self._monitor: HangMonitor | None = None
        self._pids: dict[int, int] = {}
        self._gone: set[int] = set()
        self._rounds = 0
        self._launcher_log: Path | None = None
        self._waits: dict[str, float] = {}  # why the diagnosis waits -> since when

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> int:
        for sub in ("probe", "fr", "logs", "nccl"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        self._launcher_log = self.out / "logs" / "launcher.log"
        log = self._launcher_log.open("wb")
        proc = subprocess.Popen(self.argv, env=launcher_env(os.environ, out=self.out),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        tee = threading.Thread(target=_tee, args=(proc.stdout, log), daemon=True)
        tee.start()
        self._monitor = HangMonitor.from_spec(self.policy, world_size=self._world or 1,
                                              now_s=self.clock())
        ended_by_hang = False
        try:
            while proc.poll() is None:
                if self._tick() and not self.observe:
                    ended_by_hang = True
                    _stop(proc)
                    break
                time.sleep(TICK_S)
            else:
                tee.join(timeout=5)  # the launcher's last lines (its failure summary)
                self._tick(final=True)  # ranks that ended in the last tick (a crash torchrun ended)
        except KeyboardInterrupt:
            _stop(proc)
        finally:
            proc.wait()
            tee.join(timeout=5)
            log.close()
        return HANG_EXIT if ended_by_hang else int(proc.returncode or 0)

    def _tick(self, *, final: bool = False) -> bool:
        """One look at the ranks; True when a hang was reported (the job should end).
        `final`: the launcher has exited (nothing more will end or be printed)."""
        assert self._monitor is not None
        mon, now = self._monitor, self.clock()
        counts: dict[int, int] = {}
        progress = self._progress()
        for r, prog in progress.items():
            pid = prog.get("pid")
            if isinstance(pid, int):
                self._pids[r] = pid
            c = probe_files.collective_count(prog.get("collectives"))
            if c is not None:
                counts[r] = c
        if self._world is None or len(self._pids) > mon.world_size:
            mon.world_size = max(len(self._pids), 1)
        mon.observe(now_s=now, collectives=counts)
        # A rank whose probe recorded its exit has left, even while its process still
        # finalizes: a clean leaver can outlive (under load) the peer that then fails of it.
        self._gone |= {r for r, pid in self._pids.items()
                       if not _alive(pid) or _recorded_exit(progress.get(r, {})) is not None}
        why = _exits({r: progress.get(r, {}) for r in self._gone})
        dead = _blame(why)
        live = [r for r in self._pids if r not in self._gone]
        if len(dead) > 1 and all(w.startswith(_KILLED) for w in dead.values()):
            first = self._root_cause()
            if first is not None and first in dead:
                dead = {first: dead[first]}
            elif not final and not mon.reported and self._waiting("unclear", now):
                return False  # the launcher may still say which rank failed first
        if (dead and live and not final and not mon.reported
                and all(peer_lost(w) for w in dead.values()) and self._waiting("lost peer", now)):
            # Every rank gone so far only lost a peer ("Connection closed by peer"): the peer
            # that left first is still finishing (a clean leaver outlives, under load, the
            # rank that then fails of it). Its own end names the culprit.
            return False
        if not mon.reported and any(not w.startswith(_CLEAN) for w in why.values()):
            # A rank failed (or was killed). A clean exit alone is not news: the last ranks of
            # a finished job leave one by one; if the others then wait, the stall rule fires.
            self.diagnose(trigger="exit", dead=dead, context=f"{len(self._gone)} rank(s) "
                          f"ended while {len(live)} were still running")
            mon.mark_reported()
            return True
        if self._gone and all(w.startswith(_CLEAN) for w in why.values()):
            if not live:
                return False  # every rank completed: the job is over, whatever the clock says
            if (not mon.reported and not _past_leavers(progress, live=live, gone=self._gone)
                    and self._waiting("finishing", now, FINISHING_WAIT_S)):
                # Ranks left cleanly and no live rank has entered a collective they did not:
                # the live ones are finishing too (destroying their groups, exiting), which
                # takes longer than the stall threshold on a loaded host. One that is still
                # there after the wait is reported by the stall rule.
                return False
        due = mon.due(now)
        if due is not None and due.trigger == "stall":
            self.diagnose(trigger="stall", context=due.describe(), dead=dead)
            mon.mark_reported()
            return True
        if mon.probe_due(now):
            report = self.diagnose(trigger="straggler", context="periodic time-to-enter probe",
                                   publish=False)
            if mon.keep_straggler(report):
                self._publish(report)
        return False

    def _waiting(self, why: str, now: float, wait_s: float = ROOT_CAUSE_WAIT_S) -> bool:
        """True while less than `wait_s` has passed since the diagnosis first waited for
        `why` (a bounded wait: after it, the watch names what it knows)."""
        return now - self._waits.setdefault(why, now) < wait_s

    def _root_cause(self) -> int | None:
        """The rank torchrun's failure summary names as the first observed failure, once it
        has printed one (launcher.log), else None."""
        if self._launcher_log is None:
            return None
        try:
            text = self._launcher_log.read_text(errors="replace")
        except OSError:
            return None
        summary = FailureSummary()
        events = [e for line in text.splitlines() for e in summary.feed(line)[1]]
        roots = [int(f["rank"]) for _, f in [*events, *summary.flush()]
                 if f.get("root_cause") and isinstance(f.get("rank"), int)]
        return roots[-1] if roots else None

    def _progress(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for p in (self.out / "probe").glob(f"rank*{PROGRESS_SUFFIX}"):
            rank = p.name[len("rank"):-len(PROGRESS_SUFFIX)]
            if rank.isdigit():
                got = probe_files.read_progress(self.out / "probe", int(rank), root=self.out)
                if got is not None:
                    out[int(rank)] = got
        return out

    # -- a diagnosis round ------------------------------------------------------------------
    def diagnose(self, *, trigger: str, context: str, dead: Mapping[int, str] | None = None,
                 publish: bool = True) -> DiagnosisReport:
        assert self._monitor is not None
        self._rounds += 1
        stamp = f"{stamp_now()}-{self._rounds}"
        dead = dict(dead or {})
        probe_dir = self.out / "probe"
        asked = {}
        for r in sorted(self._pids):
            if r in self._gone:
                continue
            out = rank_dir(self.out, stamp=stamp, rank=r)
            probe_files.ask(probe_dir, r, out=out, request_id=stamp, root=self.out)
            asked[r] = out
        deadline = time.monotonic() + ANSWER_S
        summaries: dict[int, dict[str, Any]] = {}
        for r, out in asked.items():
            pid = self._pids[r]
            info = probe_files.await_answer(out, request_id=stamp, root=self.out,
                                            timeout_s=max(0.1, deadline - time.monotonic()),
                                            alive=functools.partial(_alive, pid))
            if info is None:
                continue
            logs = [self.out / "nccl" / f"{self.host}.{pid}.log",
                    self.out / "logs" / "launcher.log"]
            summaries[r] = probe_files.rank_summary(info, rank=r, out=out, root=self.out,
                                                   log_paths=logs)
            pkl = out / "fr_trace.pkl"
            if pkl.is_file():
                shutil.copyfile(pkl, self.out / "fr" / f"rank_{r}")
        locations = rank_locations(assignment={r: (self.host, None) for r in self._pids})
        report = self._monitor.analysis(summaries=summaries, dead=dead, locations=locations,
                                        trigger="straggler" if trigger == "straggler"
                                        else "stall", context=context)
        if publish:
            self._publish(report)
        return report

    def _publish(self, report: DiagnosisReport) -> None:
        self.reports.append(report)
        (self.out / "report.json").write_text(report.to_json())
        (self.out / "report.md").write_text(report.to_markdown())
        self.echo(report.to_markdown().rstrip())
        self.echo(f"\nmeshyard watch: evidence in {self.out} "
                  f"(meshyard diagnose --fr {self.out / 'fr'} --logs {self.out / 'logs'})")


def _recorded_exit(prog: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The exit a rank's probe recorded as its interpreter ended, or None."""
    ex = prog.get("exited")
    return ex if isinstance(ex, Mapping) else None


def _exits(progress: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """Why each ended rank is gone, from the exit its probe recorded."""
    why: dict[int, str] = {}
    for r, prog in progress.items():
        ex = _recorded_exit(prog)
        if ex is None:
            why[r] = f"{_KILLED} (killed by a signal?)"
        elif ex.get("error"):
            why[r] = f"exited with an error: {ex['error']}"
        else:
            why[r] = f"{_CLEAN} while its peers were still running"
    return why


def _past_leavers(progress: Mapping[int, Mapping[str, Any]], *, live: Sequence[int],
                  gone: set[int]) -> bool:
    """True when a live rank has enqueued, on a group a gone rank recorded (group names are
    the same on every rank: all ranks make groups in one order), a collective the gone rank
    never did: it waits on a peer that left. A group a gone rank has no record of is one it
    was not in (or never reached), and says nothing."""
    left = [probe_files.enqueued_seqs(progress.get(r, {}).get("collectives")) for r in gone]
    for r in live:
        for pg, n in probe_files.enqueued_seqs(progress.get(r, {}).get("collectives")).items():
            if any(pg in g and n > g[pg] for g in left):
                return True
    return False


def _blame(why: Mapping[int, str]) -> dict[int, str]:
    """The ended ranks to name. A rank whose peer is gone fails its next collective with an
    error ("Connection closed by peer"): it neither exits cleanly nor dies of a signal. So
    when some ranks left cleanly (exit 0) and others did not, the clean ones are named;
    else when some died without a clean exit (a signal: gloo's abort on a size mismatch, the
    OOM killer) and others raised, the dead ones are."""
    clean = {r: w for r, w in why.items() if w.startswith(_CLEAN)}
    if clean and len(clean) < len(why):
        return clean
    killed = {r: w for r, w in why.items() if w.startswith(_KILLED)}
    return killed if killed and len(killed) < len(why) else dict(why)


def _tee(src: IO[bytes] | None, log: IO[bytes]) -> None:
    if src is None:
        return
    for line in iter(src.readline, b""):
        log.write(line)
        log.flush()
        with contextlib.suppress(OSError):
            sys.stdout.buffer.write(line)
            sys.stdout.flush()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the launcher's process group, SIGKILL after GRACE_S."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
