"""One attempt's worker gang, driven by the controller (orchestrator/runtime/controller.py).

`WorkerGang` starts the gang (`GangStart`: actors, ranks, ports, assignments), runs each
rank's assignment, and turns polls / results / actor deaths into typed values for the
controller: `RankStatus` updates, `RankFailure`s, a `Drained` batch per tick
(`RankOutputs`: what the ranks said).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from orchestrator.lifecycle import RankState
from orchestrator.runtime.answer_gaps import AnswerGaps
from orchestrator.runtime.events import AttemptConfig, Master, RankStatus, Stacks
from orchestrator.runtime.failures import RankFailure
from orchestrator.runtime.gang_output import Drained, RankOutputs
from orchestrator.runtime.gang_start import CALL_TIMEOUT_S, GangStart
from orchestrator.watchdog.stacks import MAX_NATIVE_BYTES
from workers.host.assignment import RankResult, WorkerPoll, WorkerState

__all__ = ["Drained", "WorkerGang"]

# A rank whose run call broke off with its actor "temporarily unavailable" (a cut-off host)
# is dead once its actor has answered nothing for this long; a link that comes back sooner
# costs nothing.
UNSURE_S = 15.0


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

    def drain(self) -> Drained:
        """Polls every live worker: metrics, log lines, heartbeats, per-rank updates."""
        live = {r: w for r, w in self.workers.items() if r not in self._dead}
        refs = {r: w.poll.remote() for r, w in live.items()}
        metrics: list[dict[str, Any]] = []
        logs: list[dict[str, Any]] = []
        ranks: dict[int, dict[str, Any]] = {}
        usage: list[dict[str, Any]] = []
        checkpoints: list[dict[str, Any]] = []
        collectives: dict[int, int] = {}
        timed_out: list[int] = []
        gaps: list[dict[str, Any]] = []
        answered = False
        for r, ref in refs.items():
            try:
                p: WorkerPoll = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except GetTimeoutError:
                timed_out.append(r)  # a slow or cut-off host: retried next tick
                continue
            except (RayActorError, RayError):
                continue  # the run ref reports the death
            answered = True
            silent = self._answers.answered(r, at=time.monotonic())
            if silent is not None:
                info = self.ranks[r]
                gaps.append({"rank": r, "node": info.node or info.node_id, "host": info.ip,
                             "silent_s": silent})
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
        if answered:
            for r in timed_out:
                self._answers.missed(r)
        for r, res in self._results.items():
            if res.failed:
                ranks.setdefault(r, {})["state"] = RankState.FAILED
        logs.extend(self.out.dead_ranks_output(self.ranks, self._results))
        self.out.remember_lines(logs)
        return Drained(metrics=tuple(metrics), logs=tuple(logs), ranks=ranks,
                       usage=tuple(usage), checkpoints=tuple(checkpoints),
                       collectives=collectives, gaps=tuple(gaps))

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
        refs = {r: w.diagnostics.remote(request) for r, w in self.workers.items()
                if r not in self._dead}
        out: dict[int, Any] = {}
        silent = []
        for r, ref in refs.items():
            try:
                out[r] = ray.get(ref, timeout=timeout_s)
            except (RayError, GetTimeoutError) as exc:
                out[r] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                if isinstance(exc, GetTimeoutError):
                    silent.append(r)
        # A rank that answered no diagnostics call while another did was silent (its next
        # poll answer ends a link gap); an answer here, which can take seconds of evidence
        # gathering, says nothing about when the rank was reachable.
        if len(silent) < len(refs):
            for r in silent:
                self._answers.missed(r)
        return out

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
