"""One attempt's worker gang, driven by the controller (orchestrator/runtime/controller.py).

`WorkerGang` starts the gang (`GangStart`: actors, ranks, ports, assignments), runs each
rank's assignment, and turns polls / results / actor deaths into typed values for the
controller: `RankStatus` updates, `RankFailure`s, a `Drained` batch per tick
(`RankOutputs`: what the ranks said).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from orchestrator.lifecycle import RankState
from orchestrator.runtime.answer_gaps import AnswerGaps, late_answers
from orchestrator.runtime.events import AttemptConfig, Master, RankStatus, Stacks
from orchestrator.runtime.failures import RankFailure
from orchestrator.runtime.gang_output import Drained, RankOutputs
from orchestrator.runtime.gang_start import CALL_TIMEOUT_S, GangStart
from orchestrator.watchdog.stacks import MAX_NATIVE_BYTES
from workers.host.assignment import RankResult, WorkerPoll, WorkerState

__all__ = ["Answers", "Drained", "WorkerGang"]

# A rank whose worker has answered nothing for this long while its peers answered (its polls
# timed out, or its run call broke off with the actor "temporarily unavailable") is dead: its
# host is down or cut off. Ray itself declares such a node dead only after about a minute; a
# link that comes back sooner costs nothing.
UNSURE_S = 15.0
# A rank that has answered no poll for CUT_OFF_S while its peers answered sits behind a cut-off
# link or on a dead host: a call to it is waited for only CUT_OFF_GRACE_S beyond the others'
# answers, not its full timeout (a partition must not cost every diagnostics call 20 s).
CUT_OFF_S = 10.0
CUT_OFF_GRACE_S = 3.0
_POLLS_KEPT = 3  # poll calls a rank may have out at once


class Answers:
    """The answers to one call per key (such as the rank -> ObjectRef), read as they come, all
    within one deadline of `timeout_s`; the keys in `cut_off` (a set, or a function that says
    which keys are cut off now: a rank's silence grows while its call is out) are waited for at
    most `grace_s` once every other call answered. `wait()` blocks until the calls are done
    (`gather_answers`); `wait(s)` reads what came within `s` seconds and says whether any call
    is still out. `values`: per key its value; `errors`: the RayError its call raised,
    or a GetTimeoutError when it did not answer in time."""

    def __init__(self, refs: dict[Any, Any], *, timeout_s: float,
                 cut_off: set[Any] | Callable[[], set[Any]] | None = None,
                 grace_s: float = CUT_OFF_GRACE_S) -> None:
        self.keys = list(refs)
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s
        self.values: dict[Any, Any] = {}
        self.errors: dict[Any, Any] = {}
        self.arrived: dict[Any, float] = {}  # key -> when its answer was read (monotonic)
        self._pending = {ref: r for r, ref in refs.items()}
        self._cut_off = cut_off
        self._grace_s = grace_s
        self._others_done: float | None = None

    @property
    def done(self) -> bool:
        return not self._pending

    def _end(self, now: float) -> float:
        if self._others_done is None and self._cut_off is not None:
            cut = self._cut_off() if callable(self._cut_off) else self._cut_off
            if set(self._pending.values()) <= cut:
                self._others_done = now
        return self.deadline if self._others_done is None \
            else min(self.deadline, self._others_done + self._grace_s)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Reads the answers that come within `timeout_s` (None: until every call answered or
        the deadline passed); True when no call is left to wait for."""
        limit = None if timeout_s is None else time.monotonic() + timeout_s
        while self._pending:
            now = time.monotonic()
            end = self._end(now)
            if now >= end:
                for r in self._pending.values():
                    self.errors[r] = GetTimeoutError(
                        f"no answer within {now - self.start:.1f} s")
                self._pending.clear()
                break
            stop = end if limit is None else min(end, limit)
            if callable(self._cut_off):
                stop = min(stop, now + 1.0)  # who is cut off is asked again each second
            ready, _ = ray.wait(list(self._pending), num_returns=1,
                                timeout=max(0.0, stop - now))
            for ref in ready:
                r = self._pending.pop(ref)
                self.arrived[r] = time.monotonic()
                try:
                    self.values[r] = ray.get(ref, timeout=0)
                except RayError as exc:
                    self.errors[r] = exc
            if not ready and limit is not None and time.monotonic() >= limit:
                return False
        return True


def gather_answers(refs: dict[Any, Any], *, timeout_s: float,
                   cut_off: set[Any] | Callable[[], set[Any]] | None = None,
                   grace_s: float = CUT_OFF_GRACE_S) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The answers of the calls `refs` within one deadline (`Answers`): (values, errors)."""
    answers = Answers(refs, timeout_s=timeout_s, cut_off=cut_off, grace_s=grace_s)
    answers.wait()
    return answers.values, answers.errors


def _death_message(exc: BaseException) -> str:
    """What a rank's worker death says: 'worker unreachable: ...' when Ray lost the worker's
    host (the actor cannot be reached, or its node died: a crashed or cut-off host), else
    'worker process died: ...'."""
    text = str(exc).strip().splitlines()
    detail = next((line.strip() for line in text if "exit" in line.lower()
                   or "died" in line.lower() or "killed" in line.lower()), text[0] if text else "")
    if isinstance(exc, ActorUnavailableError) or any("node has died" in line for line in text):
        return f"worker unreachable: its host is down or cut off ({detail[:300]})"
    return f"worker process died: {detail[:300]}"


class WorkerGang:
    def __init__(self, cfg: AttemptConfig, *, cancel: Any) -> None:
        self.cfg = cfg
        self.start = GangStart(cfg, cancel=cancel)
        self.out = RankOutputs(cfg)
        self._refs: dict[Any, int] = {}
        self._results: dict[int, RankResult] = {}
        self._dead: set[int] = set()
        self._last_step: dict[int, int] = {}
        self._beating: dict[int, int] = {}  # rank -> pid its worker's heartbeat names
        self._answers = AnswerGaps()
        # rank -> its poll call that did not answer within a tick: read the next tick (what
        # it returns is the rank's output; a second call is not stacked on a cut-off actor)
        self._polls: dict[int, list[Any]] = {}
        # link gaps found in a diagnostics round (its answers' network time), for drain()
        self._round_gaps: list[dict[str, Any]] = []
        # ranks found dead because their worker answered nothing while the others did:
        # their host answers no read of their files either
        self.unreachable: set[int] = set()
        # rank -> (since, message): its run call failed with the actor "temporarily
        # unavailable" (its host's link dropped): alive or dead is known by its next answer
        self._unsure: dict[int, tuple[float, str]] = {}

    @property
    def workers(self) -> dict[int, Any]:
        return self.start.workers

    @property
    def ranks(self) -> dict[int, RankStatus]:
        return self.start.ranks

    @property
    def master(self) -> Master:
        return self.start.master

    # -- start ------------------------------------------------------------------------------
    def create(self) -> tuple[RankStatus, ...] | None:
        """Creates the actors, reads where each landed and assigns ranks; None if cancelled."""
        return self.start.create()

    def launch(self) -> None:
        for r, assignment in self.start.assignments().items():
            self._refs[self.workers[r].run.remote(assignment)] = r

    # -- supervise --------------------------------------------------------------------------
    def wait(self, *, timeout_s: float) -> bool:
        """Collects finished runs; True when at least one finished in this call."""
        ended = self._settle_unsure()
        pending = [ref for ref, r in self._refs.items()
                   if r not in self._results and r not in self._unsure]
        if not pending:
            if self._unsure and not ended:
                time.sleep(timeout_s)  # only unsure ranks left: asked again next call
            return ended or not self._unsure
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
        for ref in done:
            rank = self._refs[ref]
            try:
                result: RankResult = ray.get(ref)
            except ActorUnavailableError as exc:
                # The call's connection broke; the actor may run on (a link that drops and
                # comes back). Its next answer says which (_settle_unsure).
                self._unsure[rank] = (time.monotonic(), _death_message(exc))
                continue
            except RayActorError as exc:
                self._dead.add(rank)
                self.out.died(rank)
                result = RankResult(rank=rank, state=WorkerState.ERROR, error_type="WorkerDied",
                                    message=_death_message(exc))
            except RayError as exc:
                result = RankResult(rank=rank, state=WorkerState.ERROR,
                                    error_type=type(exc).__name__, message=str(exc))
            self._results[rank] = replace(result, time=result.time or time.time())
        return bool(done) or ended

    def _settle_unsure(self) -> bool:
        """Ranks whose run call broke off: the run's result once the actor answers that it
        ended (asked each call while it runs on), or a death once it has answered nothing for
        UNSURE_S, Ray says it died, or another rank failed."""
        ended = False
        # another rank failed meanwhile (its peer went away): the attempt ends, and the
        # unreachable one is its likely cause, not a bystander
        others_failed = any(res.failed for res in self._results.values())
        for rank, (since, message) in list(self._unsure.items()):
            try:
                result = ray.get(self.workers[rank].result.remote(), timeout=0.5)
            except GetTimeoutError:
                if time.monotonic() - since < UNSURE_S and not others_failed:
                    continue
                result = RankResult(rank=rank, state=WorkerState.ERROR, error_type="WorkerDied",
                                    message=message)
            except RayActorError as exc:
                if isinstance(exc, ActorUnavailableError) and not others_failed and \
                        time.monotonic() - since < UNSURE_S:
                    continue
                result = RankResult(rank=rank, state=WorkerState.ERROR,
                                    error_type="WorkerDied", message=_death_message(exc))
            except RayError as exc:
                result = RankResult(rank=rank, state=WorkerState.ERROR,
                                    error_type=type(exc).__name__, message=str(exc))
            if result is None:  # alive and still running: the link came back; its end comes
                self._unsure[rank] = (time.monotonic(), message)  # through result() too
                continue
            del self._unsure[rank]
            if result.error_type == "WorkerDied":
                self._dead.add(rank)
                self.out.died(rank)
                if (result.message or "").startswith("worker unreachable"):
                    self.unreachable.add(rank)
            self._results[rank] = replace(result, time=result.time or time.time())
            ended = True
        return ended

    def settle(self, *, timeout_s: float, max_s: float = 15.0) -> None:
        """After a failure: waits for the other ranks' ends that are on their way (a dead
        process surfaces a moment after the errors it causes), until every rank has ended or
        none has for `timeout_s`, `max_s` at the most: a cascade of peers that lose one
        another, slow to report on a loaded host, is seen whole."""
        start = last_end = time.monotonic()
        ended = len(self._results)
        while len(self._results) < len(self._refs):
            now = time.monotonic()
            if now >= min(last_end + timeout_s, start + max_s):
                return
            self.wait(timeout_s=0.1)
            if len(self._results) > ended:
                ended, last_end = len(self._results), time.monotonic()

    def drain(self, *, final: bool = False) -> Drained:
        """Polls every live worker: metrics, log lines, heartbeats, per-rank updates.
        `final`: the attempt's last drain, which waits for the dead ranks' last output
        (RankOutputs.dead_ranks_output)."""
        live = {r: w for r, w in self.workers.items() if r not in self._dead}
        # A poll not answered within its tick stays asked (what it returns is the rank's
        # output, read when it comes); a new one goes out beside it each tick, at most
        # _POLLS_KEPT a rank (after a link drops, an old call may never come back).
        calls: dict[tuple[int, int], Any] = {}
        for r, w in live.items():
            kept = self._polls.pop(r, [])[-(_POLLS_KEPT - 1):]
            for i, ref in enumerate([*kept, w.poll.remote()]):
                calls[(r, i)] = ref
        metrics: list[dict[str, Any]] = []
        logs: list[dict[str, Any]] = []
        ranks: dict[int, dict[str, Any]] = {}
        usage: list[dict[str, Any]] = []
        checkpoints: list[dict[str, Any]] = []
        collectives: dict[int, int] = {}
        gaps: list[dict[str, Any]] = self._round_gaps
        self._round_gaps = []
        cut_off = self.cut_off()
        answers = Answers(calls, timeout_s=CALL_TIMEOUT_S,
                          cut_off={k for k in calls if k[0] in cut_off}, grace_s=1.0)
        answers.wait()
        polled, errors = answers.values, answers.errors
        # a slow or cut-off host: its calls are read next tick; a dead one's run ref reports it
        for key in sorted(k for k, e in errors.items() if isinstance(e, GetTimeoutError)):
            self._polls.setdefault(key[0], []).append(calls[key])
        # A rank that answered no call of this round (timed out, or failed at once: its
        # connection broke) while others answered missed it: its silence is its own.
        now = time.monotonic()
        ended = self._answers.round({r: now for r, _ in polled}, asked=live)
        # A poll sent this tick that came back `min_s` or more after its peers' (a poll is
        # served at once): the rank's link dropped and came back while the call was out.
        newest = {r: i for r, i in sorted(calls)}  # the highest index: this tick's call
        late = late_answers({r: 0.0 for (r, i) in polled if i == newest[r]},
                            {r: t for (r, i), t in answers.arrived.items()
                             if i == newest[r] and (r, i) in polled},
                            sent=answers.start, min_s=self._answers.min_s)
        ended.update({r: t for r, t in late.items() if r not in ended})
        for r, silent in sorted(ended.items()):
            info = self.ranks[r]
            gaps.append({"rank": r, "node": info.node or info.node_id, "host": info.ip,
                         "silent_s": silent})
        for key in sorted(polled):  # a rank's older call first
            r = key[0]
            p: WorkerPoll = polled[key]
            metrics.extend(p.metrics)
            logs.extend(p.logs)
            checkpoints.extend(p.checkpoints)
            if p.usage is not None and self.out.keep_usage(r, float(p.usage["at"])):
                usage.append(dict(p.usage, rank=r, node=self.ranks[r].node))
            upd: dict[str, Any] = {"state": RankState(p.state.upper())}
            if p.metrics:
                self._last_step[r] = int(p.metrics[-1].get("step", 0))
            hb = p.heartbeat
            if hb is not None:
                self._beating[r] = hb.pid
                if hb.collective_count is not None:
                    collectives[r] = hb.collective_count
                    upd["collectives"] = hb.collective_count
                upd.update(step=hb.step, phase=hb.phase, last_heartbeat=hb.time, pid=hb.pid,
                           start_step=hb.start_step)
            elif r in self._last_step:
                upd["step"] = self._last_step[r]
            ranks[r] = upd
        self._end_unreachable()
        for r, res in self._results.items():
            if res.failed:
                ranks.setdefault(r, {})["state"] = RankState.FAILED
        logs.extend(self.out.dead_ranks_output(self.ranks, self._results,
                                               unreachable=self.unreachable, final=final))
        self.out.remember_lines(logs)
        return Drained(metrics=tuple(metrics), logs=tuple(logs), ranks=ranks,
                       usage=tuple(usage), checkpoints=tuple(checkpoints),
                       collectives=collectives, gaps=tuple(gaps))

    def _end_unreachable(self) -> None:
        """Ranks silent for UNSURE_S while their peers answered are dead (worker unreachable)."""
        for r in sorted(self.cut_off()):
            silent = self.silent_s(r)
            if r in self._results or silent < UNSURE_S:
                continue
            self._unsure.pop(r, None)
            self.unreachable.add(r)
            self._dead.add(r)
            self.out.died(r)
            self._results[r] = RankResult(
                rank=r, state=WorkerState.ERROR, error_type="WorkerDied", time=time.time(),
                message=f"worker unreachable: its host is down or cut off (it answered no "
                f"call for {silent:.0f} s while the other ranks did)")

    def unreachable_nodes(self) -> tuple[str, ...]:
        """Ray node ids of the ranks found unreachable or cut off now."""
        ranks = self.unreachable | self.cut_off()
        return tuple(sorted({str(self.ranks[r].node_id) for r in ranks
                             if r in self.ranks and self.ranks[r].node_id}))

    def host_workers(self) -> dict[str, Any]:
        """One worker actor per host address among the live ranks (the lowest rank's): the
        hosts' disks, which the simulated nodes of one machine share."""
        out: dict[str, Any] = {}
        for r in sorted(self.workers):
            ip = self.ranks[r].ip if r in self.ranks else None
            if ip and r not in self._dead and ip not in out:
                out[ip] = self.workers[r]
        return out

    def cut_off_hosts(self) -> set[str]:
        """Addresses of the hosts with a rank unreachable or cut off now (a dead actor's
        calls end with its death)."""
        ranks = self.unreachable | self.cut_off()
        return {str(self.ranks[r].ip) for r in ranks if r in self.ranks and self.ranks[r].ip}

    def cut_off(self) -> set[int]:
        """Live ranks whose worker has answered no poll for CUT_OFF_S while a peer answered."""
        return {r for r in self.workers if r not in self._dead and self.silent_s(r) >= CUT_OFF_S}

    def silent_s(self, rank: int) -> float:
        """How long `rank` has answered no poll while a peer answered (0.0: it answers)."""
        return self._answers.silent_for(rank, now=time.monotonic())

    def last_steps(self) -> dict[int, int]:
        return dict(self._last_step)

    def finished(self) -> dict[int, RankResult]:
        """Ranks whose process ended with exit code 0 (their run completed)."""
        return {r: res for r, res in self._results.items() if not res.failed}

    def all_beating(self) -> bool:
        """Every rank has sent a heartbeat (user code: every rank's process runs)."""
        return bool(self.ranks) and set(self._beating) >= set(self.ranks)

    def pids(self) -> tuple[int, ...]:
        """Per rank, the pid its heartbeat names (user code: the rank process)."""
        return tuple(self._beating[r] for r in sorted(self._beating))

    def failures(self) -> list[RankFailure]:
        """Failed ranks, earliest first."""
        fs = [RankFailure(rank=r, error_type=res.error_type or "Error", message=res.message,
                          node=self.ranks[r].node, node_id=self.ranks[r].node_id,
                          traceback=res.traceback, time=res.time or 0.0,
                          setup_error=res.setup_error, exit_code=res.exit_code)
              for r, res in self._results.items() if res.failed]
        return sorted(fs, key=lambda f: (f.time, f.rank))

    def all_done(self) -> bool:
        return len(self._results) == len(self._refs) and not self.failures()

    def stop_all(self, *, grace_s: float, rank_grace_s: float | None = None) -> None:
        """Asks every running rank to stop and waits up to `grace_s` for them to end;
        `rank_grace_s`: a user-code rank's SIGTERM -> SIGKILL time (default the worker's)."""
        for r, w in self.workers.items():
            if r not in self._results:
                w.stop.remote(rank_grace_s)
        self.settle(timeout_s=grace_s, max_s=grace_s)

    def kill(self, *, succeeded: bool = False) -> None:
        """Ends every worker (warm ones go back to the pool, see GangStart.release)."""
        self.start.release(succeeded=succeeded)

    def diagnostics(self, *, request: dict[str, Any], timeout_s: float) -> dict[int, Any]:
        """Every live rank's answer to `diagnostics(request)` within `timeout_s` (one deadline
        for all); a rank cut off for CUT_OFF_S is waited for CUT_OFF_GRACE_S beyond the
        others. A rank without an answer maps to {"error": "<exception type>: ..."}."""
        refs = {r: w.diagnostics.remote(request) for r, w in self.workers.items()
                if r not in self._dead}
        # cut off as the call goes: a rank that went silent just before it is given up
        # CUT_OFF_GRACE_S after its peers once its silence reaches CUT_OFF_S, not at the deadline
        answers = Answers(refs, timeout_s=timeout_s, cut_off=self.cut_off)
        answers.wait()
        out, errors = answers.values, answers.errors
        self._late_in_round(answers)
        for r, exc in errors.items():
            out[r] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        silent = [r for r, exc in errors.items() if isinstance(exc, GetTimeoutError)]
        # A rank that answered no diagnostics call while another did was silent (its next
        # poll answer ends a link gap); an answer here, which can take seconds of evidence
        # gathering, says nothing about when the rank was reachable.
        if len(silent) < len(refs):
            for r in silent:
                self._answers.missed(r)
        return {r: out[r] for r in refs}

    def _late_in_round(self, answers: Answers) -> None:
        """A rank whose diagnostics answer spent `min_s` or more on the network (its wait less
        the `served_s` its worker spent gathering) while every peer's spent `min_s` less: its
        link dropped and came back during the round, when no poll runs (a LinkGap)."""
        served = {r: v.get("served_s") for r, v in answers.values.items() if isinstance(v, dict)}
        late = late_answers(served, answers.arrived, sent=answers.start,
                            min_s=self._answers.min_s)
        for r, t in late.items():
            if r in self.ranks:
                info = self.ranks[r]
                self._round_gaps.append({"rank": r, "node": info.node or info.node_id,
                                         "host": info.ip, "silent_s": t})

    def stacks(self, request_id: int, *, timeout_s: float) -> Stacks:
        """"Stacks now": every live rank's Python stacks (or why a rank gave none)."""
        replies = self.diagnostics(request={"kind": "stacks"}, timeout_s=timeout_s)
        ranks = {r: dict(x["stacks"]) for r, x in replies.items()
                 if isinstance(x, dict) and isinstance(x.get("stacks"), dict)}
        errors = {r: str(x.get("error", "no stacks in the answer"))[:500]
                  for r, x in replies.items() if r not in ranks and isinstance(x, dict)}
        errors.update({r: "its process is gone" for r in self.ranks if r not in replies})
        native = {r: x["native"][:MAX_NATIVE_BYTES] for r, x in replies.items()
                  if isinstance(x, dict) and isinstance(x.get("native"), str)}
        return Stacks(request_id=request_id, ranks=ranks, errors=errors, native=native)
