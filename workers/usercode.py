"""The worker actor's side of a user-code rank: start the rank process, follow it, report.

`run_user_rank(a, ...)` is what `WorkerActor.run` does for a job with an `entrypoint`:

1. the code's directory on this node: an uploaded package unpacked by Ray's working_dir
   (`<actor cwd>/meshyard-code`), a path the spec names, or the job's run dir;
2. the rank's argv and environment (workers/user_env.py) and one process
   (workers/rankproc.py) in that directory;
3. while it runs: the records it appends to its report file (meshyard.train.report) become
   metrics rows, a heartbeat names its pid and last reported step, a stop request ends the
   whole process tree (SIGTERM, then SIGKILL);
4. its exit becomes the RankResult: the runner's error record (exception type, message,
   traceback, whether the code could not even load) or the exit code / signal.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.limits import MAX_STEPS
from orchestrator.packages import CODE_DIR
from workers.assignment import RankAssignment, RankResult, WorkerState
from workers.env import debug_env
from workers.logcapture import LineTail, private_opener
from workers.rankproc import RankProcess
from workers.user_env import rank_argv, rank_env

STOP_GRACE_S = 3.0
_TICK_S = 0.2


class Sink(Protocol):
    heartbeat: dict[str, Any] | None
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
    else:
        what, kind = "the rank process exited", "ExitCode"
    message = str(err.get("message") or what)
    return RankResult(state=WorkerState.ERROR, error_type=str(err.get("type") or kind),
                      message=message, traceback=str(err.get("traceback") or ""),
                      setup_error=bool(err.get("setup")), **common)


def _setup_failure(a: RankAssignment, message: str) -> RankResult:
    return RankResult(rank=a.rank, state=WorkerState.ERROR, error_type="SetupError",
                      message=message, setup_error=True)


def run_user_rank(a: RankAssignment, *, sink: Sink, stop: threading.Event,
                  actor_cwd: str, on_start: Any = None) -> RankResult:
    """Runs rank `a.rank`'s process to its end (see the module doc). `on_start(proc)` is
    called once the process exists."""
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
    env = rank_env(a, base=os.environ, code_dir=str(where), report_file=str(report),
                   debug=debug_env(a.spec, run_dir=a.run_dir), parent_pid=os.getpid(),
                   function_config=str(config) if config else None, runtime_root=actor_cwd)
    for sub in ("nccl", "flight_recorder", "checkpoints"):
        (Path(a.run_dir) / sub).mkdir(parents=True, exist_ok=True)
    tail, seen = LineTail(report), _Seen()
    proc = RankProcess(rank_argv(ep, python=sys.executable), env=env, cwd=str(where)).start()
    if on_start is not None:
        on_start(proc)
    stopped = False
    while True:
        sink.heartbeat = {"rank": a.rank, "step": seen.step or 0, "phase": "user",
                          "time": time.time(), "phase_since": t0, "collectives": {},
                          "pid": proc.pid}
        rc = proc.wait(_TICK_S)
        _consume(tail.read(final=rc is not None), a=a, sink=sink, seen=seen)
        if rc is not None:
            break
        if stop.is_set() and not stopped:
            stopped = True
            proc.terminate(grace_s=STOP_GRACE_S)
    proc.kill_tree()  # whatever the rank left running (daemons, re-parented grandchildren)
    return _outcome(a, rc, seen=seen, stopped=stopped, seconds=time.time() - t0)
