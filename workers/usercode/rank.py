"""The worker actor's side of a user-code rank: start the rank process, follow it, report.

`run_user_rank(a, ...)` is what `WorkerActor.run` does for a job with an `entrypoint`:

1. the code's directory on this node: an uploaded package unpacked by Ray's working_dir
   (`<actor cwd>/meshyard-code`), a path the spec names, or the job's run dir;
2. the rank's argv and environment (workers/usercode/environment.py); with the pre-flight check
   on (and more than one rank), first the check, on a rendezvous port of its own, in the
   process that then becomes the rank (a prestarted one, meshyard/_prestart.py, started now
   when the actor has none; a child it forks runs the check), so torch is imported once for
   both; a failed check ends the rank as `PreflightFailed` before the user's code starts, as
   the built-in loop's does;
3. one process (workers/host/rankproc.py) in the code's directory: started now, or, on a pooled
   actor, the process it started before the job (meshyard/_prestart.py: torch already
   imported) made into the same rank;
4. while it runs: the records it appends to its report file (meshyard.train.report) become
   metrics rows, a heartbeat names its pid, last reported step and the collective seqs the
   probe inside the process (meshyard/_probe.py) last sampled, a stop request ends the whole
   process tree (SIGTERM, then SIGKILL);
5. its exit becomes the RankResult: the runner's error record (exception type, message,
   traceback, whether the code could not even load) or the exit code / signal.

`rank_evidence(a, ...)` is the hang watchdog's diagnostics for such a rank: it asks the
probe for its evidence (stacks, Flight Recorder dump, the user's frame) and returns the
analyzer's per-rank summary (orchestrator/watchdog/probe_files.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from meshyard import _protocol as proto
from meshyard._confine import ConfineError
from orchestrator.bounds.limits import MAX_STEPS
from orchestrator.isolation import runfiles
from orchestrator.isolation.worker_env import allowlisted
from orchestrator.usercode.packages import CODE_DIR
from orchestrator.watchdog import probe_files
from orchestrator.watchdog.evidence_files import rank_dir, stamp_now
from workers.host.assignment import RankAssignment, RankBeat, RankResult, WorkerState
from workers.host.confinement import Unconfinable, node_share, plan_for, port_layer, remove_shm_dir
from workers.host.env import debug_env
from workers.host.logcapture import LineTail, private_opener
from workers.host.rankproc import (
    STOP_GRACE_S,
    Confinement,
    PrestartedRank,
    RankProcess,
    alive,
)
from workers.usercode.environment import rank_argv, rank_env

_TICK_S = 0.2
# Where meshyard's packages live (the directory holding `meshyard/`): the working directory
# a rank's check process starts in, so nothing of the job's is first on its path.
MESHYARD_ROOT = str(Path(proto.__file__).resolve().parent.parent)
PROBE_SUBDIR = "probe"
PROBE_ANSWER_S = 10.0  # the first Flight Recorder dump of a process can take seconds


class Sink(Protocol):
    heartbeat: RankBeat | None
    last_step: int | None

    def metric(self, row: dict[str, Any]) -> None: ...

    def log(self, stream: str, line: str) -> None: ...


@dataclass
class _Seen:
    error: dict[str, Any] | None = None
    step: int | None = None


def code_dir(a: RankAssignment, *, actor_cwd: str) -> Path:
    ep = a.spec.entrypoint
    assert ep is not None
    if ep.package is not None:
        return Path(actor_cwd) / CODE_DIR
    if ep.working_dir is not None:
        return Path(ep.working_dir)
    return Path(a.run_dir)


def unpack_package(uri: str, *, base: Path) -> Path:
    """A pooled actor's copy of an uploaded package (`gcs://` URI, see
    orchestrator/runtime/packages.py), unpacked once per node under `base` with Ray's own
    unzip, as Ray's working_dir does for an actor created with it: the returned directory
    holds `CODE_DIR/`. Ranks on one node race to unpack; the first rename wins."""
    import shutil
    import tempfile

    from ray._private.runtime_env.packaging import unzip_package
    from ray.experimental.internal_kv import _internal_kv_get

    target = base / Path(uri.partition("://")[2]).stem
    if target.is_dir():
        return target
    data = _internal_kv_get(uri)
    if data is None:
        raise FileNotFoundError(f"package {uri} is not in Ray's GCS (it is uploaded again "
                                "when the next attempt is placed)")
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=".unpack-"))
    zipped, unpacked = tmp / "package.zip", tmp / "package"
    with open(zipped, "wb", opener=private_opener) as f:
        f.write(data)
    unzip_package(str(zipped), str(unpacked), remove_top_level_directory=False, unlink_zip=True)
    with contextlib.suppress(OSError):  # another rank of this node unpacked it first
        unpacked.rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def metric_row(rec: dict[str, Any], *, rank: int) -> dict[str, Any] | None:
    """A report record -> a metrics row like the built-in loop's (None if malformed)."""
    step = rec.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEPS:
        return None
    raw = rec.get("metrics")
    metrics: dict[str, Any] = raw if isinstance(raw, dict) else {}
    row = {k: v for k, v in metrics.items() if isinstance(v, int | float | str | None)}
    row.update(rank=rank, step=step, time=float(rec.get("time") or time.time()))
    if isinstance(rec.get("checkpoint"), str):
        row["checkpoint"] = rec["checkpoint"]
    return row


def _consume(lines: list[str], *, a: RankAssignment, sink: Sink, seen: _Seen) -> None:
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            sink.log("log", f"WARNING ignored a malformed report line: {line[:200]!r}")
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("kind") == "error":
            seen.error = rec
        elif rec.get("kind") == "report":
            row = metric_row(rec, rank=a.rank)
            if row is None:
                sink.log("log", f"WARNING ignored a report without a valid step: {line[:200]}")
                continue
            seen.step = row["step"]
            sink.metric(row)


def _outcome(a: RankAssignment, rc: int, *, seen: _Seen, stopped: bool,
             seconds: float) -> RankResult:
    common: dict[str, Any] = {"rank": a.rank, "last_step": seen.step, "seconds": seconds,
                              "exit_code": rc}
    if rc == 0 or stopped:
        state = WorkerState.STOPPED if stopped else WorkerState.COMPLETED
        return RankResult(state=state, **common)
    err = seen.error or {}
    if rc < 0:
        try:
            what = f"the rank process was killed by {signal.Signals(-rc).name}"
        except ValueError:
            what = f"the rank process was killed by signal {-rc}"
        kind = "Signal"
        last = last_error_line(a.log_path("stderr"), beneath=a.run_dir)
        if last:
            what += f" after: {last}"  # gloo's abort says why ("100 vs 16 ... mismatch")
    else:
        what, kind = "the rank process exited", "ExitCode"
    message = str(err.get("message") or what)
    return RankResult(state=WorkerState.ERROR, error_type=str(err.get("type") or kind),
                      message=message, traceback=str(err.get("traceback") or ""),
                      setup_error=bool(err.get("setup")), **common)


_ERROR_LINE = re.compile(r"what\(\):|Error|error:|terminate called")


def last_error_line(path: Path, *, beneath: str, max_bytes: int = 16 * 1024) -> str | None:
    """The last line of a log's tail that reads like an error (a C++ abort's `what():`)."""
    try:
        data = runfiles.tail(beneath, path, max_bytes=max_bytes)
    except OSError:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    hits = [ln.strip() for ln in lines if _ERROR_LINE.search(ln)]
    what = [ln for ln in hits if "what():" in ln]
    found = what or hits
    return found[-1][:500] if found else None


def _setup_failure(a: RankAssignment, message: str) -> RankResult:
    return RankResult(rank=a.rank, state=WorkerState.ERROR, error_type="SetupError",
                      message=message, setup_error=True)


def run_user_rank(a: RankAssignment, *, sink: Sink, stop: threading.Event,
                  actor_cwd: str, on_start: Any = None,
                  prestarted: PrestartedRank | None = None) -> RankResult:
    """Runs rank `a.rank`'s process to its end (see the module doc). `on_start(proc)` is
    called once the process exists. `prestarted` (a pooled actor's): the process to become
    the rank when it can (PrestartedRank.fits), else the rank starts cold."""
    t0 = time.time()
    ep = a.spec.entrypoint
    assert ep is not None
    where = code_dir(a, actor_cwd=actor_cwd)
    if not where.is_dir():
        return _setup_failure(a, f"working dir {where} does not exist on this node; upload "
                              "the code (meshyard submit --working-dir) or use a path every "
                              "node can read")
    report = a.log_path("reports.jsonl")
    report.parent.mkdir(parents=True, exist_ok=True)
    with open(report, "a", opener=private_opener):
        pass
    config = None
    if ep.function is not None:
        config = a.log_path("config.json")
        with open(config, "w", opener=private_opener) as f:
            json.dump(ep.config, f)
    probe_dir = probe_path(a)
    probe_dir.mkdir(parents=True, exist_ok=True)
    probe_files.request_path(probe_dir, a.rank).unlink(missing_ok=True)
    proto.stop_path(probe_dir, a.rank).unlink(missing_ok=True)
    confine = None
    if a.confinement is not None and a.confinement.confined:
        try:
            confine = _confinement(a, code_dir=str(where))
        except (Unconfinable, OSError) as exc:
            return _setup_failure(a, f"this node cannot confine the rank: {exc}")
    env = rank_env(a, base=os.environ, code_dir=str(where), report_file=str(report),
                   debug=debug_env(a.spec, run_dir=a.run_dir), parent_pid=os.getpid(),
                   function_config=str(config) if config else None, runtime_root=actor_cwd,
                   probe_dir=str(probe_dir), confined=confine is not None)
    for sub in ("nccl", "flight_recorder"):
        (Path(a.run_dir) / sub).mkdir(parents=True, exist_ok=True)
    Path(a.checkpoint_root).mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        return _run_rank(a, env=env, where=where, report=report, probe_dir=probe_dir,
                         sink=sink, stop=stop, prestarted=prestarted, on_start=on_start,
                         confine=confine, actor_cwd=actor_cwd, t0=t0)
    except ConfineError as exc:
        return _setup_failure(a, str(exc))
    finally:
        if confine is not None:
            remove_shm_dir(a)


def _confinement(a: RankAssignment, *, code_dir: str) -> Confinement:
    assert a.confinement is not None
    plan = plan_for(a, a.confinement, code_dir=code_dir, share=node_share())
    return Confinement(plan=plan, net_fd=port_layer(plan.denied_ports))


def _run_rank(a: RankAssignment, *, env: dict[str, str], where: Path, report: Path,
              probe_dir: Path, sink: Sink, stop: threading.Event,
              prestarted: PrestartedRank | None, on_start: Any, confine: Confinement | None,
              actor_cwd: str, t0: float) -> RankResult:
    ep = a.spec.entrypoint
    assert ep is not None
    argv = rank_argv(ep, python=sys.executable)
    spawned: PrestartedRank | None = None
    try:
        if prestarted is None:
            # the process the fork server forked with this actor (torch imported), if any
            prestarted = spawned = PrestartedRank.preforked(
                net=(confine.net_fd, confine.plan.denied_ports) if confine else None)
        if a.runs_user_preflight:
            if prestarted is None or prestarted.pid is None or prestarted.returncode() is not None:
                # the process that runs the check and then becomes the rank: one torch
                # import for both (torch._dynamo only if the rank's code wants it). It
                # starts in meshyard's own directory with the code off its path: what it
                # imports before its request is meshyard's.
                prestarted = spawned = PrestartedRank.spawn(
                    python=sys.executable, env=allowlisted(os.environ), cwd=MESHYARD_ROOT,
                    net=(confine.net_fd, confine.plan.denied_ports) if confine else None,
                    hide=(actor_cwd, str(where)), dynamo=False)
            failed = _preflight(a, proc=prestarted, env=env, stop=stop, sink=sink,
                                hide=(actor_cwd, str(where)))
            if failed is not None:
                return failed
        return _follow_rank(a, argv=argv, env=env, where=where, report=report,
                            probe_dir=probe_dir, sink=sink, stop=stop, prestarted=prestarted,
                            on_start=on_start, confine=confine, t0=t0)
    finally:
        if spawned is not None:
            spawned.close()  # not handed (a failed check, a misfit): never reused


def _follow_rank(a: RankAssignment, *, argv: list[str], env: dict[str, str], where: Path,
                 report: Path, probe_dir: Path, sink: Sink, stop: threading.Event,
                 prestarted: PrestartedRank | None, on_start: Any,
                 confine: Confinement | None, t0: float) -> RankResult:
    tail, seen = LineTail(report, beneath=a.run_dir), _Seen()
    proc = prestarted.hand(argv, env=env, cwd=str(where), stdout=a.log_path("stdout"),
                           stderr=a.log_path("stderr"), confine=confine) \
        if prestarted is not None else None
    if proc is None:
        if prestarted is not None:
            sink.log("log", "INFO the rank process starts cold, not prestarted: "
                     f"{prestarted.misfit(argv, env, confine)}")
        proc = RankProcess(argv, env=env, cwd=str(where), confine=confine).start()
    if on_start is not None:
        on_start(proc)
    stopped = False
    while True:
        marks = (probe_files.read_progress(probe_dir, a.rank, root=a.run_dir) or {}
                 ).get("collectives") or {}
        sink.heartbeat = RankBeat(rank=a.rank, step=seen.step or 0, phase="user",
                                  time=time.time(), phase_since=t0, collectives=marks,
                                  collective_count=probe_files.collective_count(marks),
                                  pid=proc.pid)
        rc = proc.wait(_TICK_S)
        _consume(tail.read(final=rc is not None), a=a, sink=sink, seen=seen)
        if rc is not None:
            break
        if stop.is_set() and not stopped:
            stopped = True
            with contextlib.suppress(OSError):  # should_stop() is true from now on
                proto.stop_path(probe_dir, a.rank).touch()
            proc.terminate(grace_s=getattr(stop, "grace_s", STOP_GRACE_S))
    proc.kill_tree()  # whatever the rank left running (daemons, re-parented grandchildren)
    return _outcome(a, rc, seen=seen, stopped=stopped, seconds=time.time() - t0)


def _preflight(a: RankAssignment, *, proc: PrestartedRank, env: dict[str, str],
               stop: threading.Event, sink: Sink, hide: tuple[str, ...]) -> RankResult | None:
    """Runs the pre-flight check for rank `a.rank` from `proc`, the process that then becomes
    the rank (PrestartedRank.preflight: a child it forks runs the check, so torch is imported
    once for the check and the rank, and the rank's process keeps nothing of the check's).
    None when it passed, else how the rank ended. It sends no heartbeat (the user's code has
    not started yet)."""
    t0 = time.time()
    answer = proc.preflight(pickle.dumps(a), env=env, hide=hide, stop=stop)
    if answer is None:
        if stop.is_set():
            return RankResult(rank=a.rank, state=WorkerState.STOPPED, seconds=time.time() - t0)
        return _preflight_outcome(a, None, rc=proc.returncode(), t0=t0, sink=sink)
    if "error" in answer:
        return RankResult(rank=a.rank, state=WorkerState.ERROR, error_type="PreflightError",
                          message=f"the pre-flight check did not run: {answer['error']}"[:2000],
                          seconds=time.time() - t0)
    return _preflight_outcome(a, answer.get("out"), rc=None, t0=t0, sink=sink)


def _preflight_outcome(a: RankAssignment, out: Any, *, rc: int | None, t0: float,
                       sink: Sink) -> RankResult | None:
    if isinstance(out, dict) and out.get("ok"):
        sink.log("log", f"INFO pre-flight check passed in {float(out['seconds']):.3f} s "
                 f"({out['tests']} tests of {int(out['bytes']) / 2**20:g} MiB, forked from the "
                 f"rank's process {time.time() - t0:.1f} s)")
        return None
    if isinstance(out, dict) and out.get("message"):
        return RankResult(rank=a.rank, state=WorkerState.ERROR, error_type="PreflightFailed",
                          message=str(out["message"]), seconds=time.time() - t0, exit_code=rc)
    last = last_error_line(a.log_path("stderr"), beneath=a.run_dir)
    return RankResult(rank=a.rank, state=WorkerState.ERROR, error_type="PreflightError",
                      message=f"the pre-flight check's process exited {rc}"
                      + (f": {last}" if last else ""), seconds=time.time() - t0, exit_code=rc)


def probe_path(a: RankAssignment) -> Path:
    """The rank's probe folder, one per attempt: a new attempt's watchdog never reads the
    collective counts an earlier attempt's ranks left (they would pass for progress)."""
    return Path(a.run_dir).resolve() / PROBE_SUBDIR / f"attempt-{a.attempt}"


def rank_evidence(a: RankAssignment, *, request: dict[str, Any],
                  heartbeat: RankBeat | None) -> dict[str, Any] | None:
    """The analyzer's summary of rank `a.rank`, from its probe (None when the process did
    not answer within PROBE_ANSWER_S: it died, or it never reached the runner)."""
    stamp = str(request.get("stamp") or stamp_now())
    out = rank_dir(a.run_dir, stamp=stamp, rank=a.rank)
    request_id = f"{stamp}-{time.monotonic_ns()}"
    root = Path(a.run_dir).resolve()
    probe_files.ask(probe_path(a), a.rank, out=out, request_id=request_id, root=root,
                    native=request.get("native") is not False)
    pid = heartbeat.pid if heartbeat is not None else None
    info = probe_files.await_answer(
        out, request_id=request_id, timeout_s=PROBE_ANSWER_S, root=root,
        alive=functools.partial(alive, pid) if isinstance(pid, int) else None)
    if info is None:
        return None
    logs = [str(a.log_path("stderr"))]
    pid = info.get("pid")
    if pid:
        logs.insert(0, str(Path(a.run_dir) / "nccl" / f"{os.uname().nodename}.{pid}.log"))
    step = heartbeat.running_step if heartbeat is not None else None
    return probe_files.rank_summary(info, rank=a.rank, out=out, root=root, step=step,
                                    log_paths=logs)
