"""The Ray actor that hosts one rank: thin glue around the workers core.

The controller creates one `WorkerActor` per placement-group bundle, asks it where it landed
(`info`: Ray node id, GPU ids, IP), then calls `run(assignment)`, which

1. applies the rank environment (``workers.env.worker_env``: RANK, WORLD_SIZE, MASTER_ADDR/PORT,
   NCCL and Flight Recorder variables),
2. redirects this process's stdout / stderr (file descriptors 1 and 2, so C++ output from gloo
   or NCCL is captured too) to ``<run_dir>/logs/attempt-<n>/rank-<r>.{stdout,stderr}``,
3. runs the training function (``workers.loop:run_training`` unless the assignment names
   another import path) in the actor's default thread, and returns a small result dict, or an
   error dict with the exception type, message and traceback.

While it runs, the controller drains `poll()` (heartbeat, metrics, log lines) and may call
`stop()`; both live in the "control" concurrency group so they are served while the training
thread is busy. `diagnostics()` has its own group ("diag") so a hang investigation is never
queued behind a poll.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from workers.logcapture import LogCapture, private_opener

_MAX_BUFFERED_LOGS = 20_000
_MAX_BUFFERED_METRICS = 100_000


def _load(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class _Buffer:
    """What the training thread reports, drained by the controller's polls (thread-safe)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._metrics: deque[dict[str, Any]] = deque(maxlen=_MAX_BUFFERED_METRICS)
        self._logs: deque[dict[str, Any]] = deque(maxlen=_MAX_BUFFERED_LOGS)
        self._dropped_logs = 0
        self.heartbeat: dict[str, Any] | None = None
        self.last_step: int | None = None

    def metric(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._metrics.append(dict(row, rank=self.rank))
            self.last_step = row.get("step", self.last_step)

    def log(self, stream: str, line: str) -> None:
        with self._lock:
            if len(self._logs) == self._logs.maxlen:
                self._dropped_logs += 1
            self._logs.append({"rank": self.rank, "stream": stream, "line": line,
                               "time": time.time()})

    def drain(self) -> dict[str, Any]:
        with self._lock:
            out = {"metrics": list(self._metrics), "logs": list(self._logs),
                   "heartbeat": self.heartbeat, "last_step": self.last_step,
                   "dropped_logs": self._dropped_logs}
            self._metrics.clear()
            self._logs.clear()
            self._dropped_logs = 0
        return out


class _ActorCallbacks:
    """The loop's callbacks (see workers/callbacks.py), forwarding into the poll buffer."""

    def __init__(self, buf: _Buffer, log_file: Path) -> None:
        self._buf = buf
        self._log_file = log_file

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._buf.metric(metrics)

    def on_heartbeat(self, hb: Any) -> None:
        self._buf.heartbeat = hb.to_dict() if hasattr(hb, "to_dict") else dict(hb)

    def on_log(self, level: str, message: str) -> None:
        self._buf.log("log", f"{level} {message}")
        with open(self._log_file, "a", opener=private_opener) as f:
            f.write(f"{time.strftime('%H:%M:%S')} {level} {message}\n")


@ray.remote(concurrency_groups={"control": 2, "diag": 1})  # type: ignore[call-overload]
class WorkerActor:
    """One rank. Ray restarts nothing here: a dead actor is a failed attempt."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._buf = _Buffer(rank=-1)
        self._state = "idle"
        self._assignment: dict[str, Any] | None = None
        self._last_assignment: dict[str, Any] | None = None  # diagnostics after a failed run
        self._jobs_run = 0
        self._baseline_threads = {t.ident for t in threading.enumerate()}

    @ray.method(concurrency_group="control")
    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
                "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "hostname": socket.gethostname(), "jobs_run": self._jobs_run}

    @ray.method(concurrency_group="control")
    def free_port(self) -> int:
        """A port free on this node now, for MASTER_PORT when this actor is rank 0."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ray.util.get_node_ip_address(), 0))
            return int(s.getsockname()[1])

    @ray.method(concurrency_group="control")
    def warm(self) -> float:
        """Imports torch and the workers core now, so a pooled actor starts its job fast."""
        t0 = time.perf_counter()
        import torch  # noqa: F401

        for mod in ("workers.loop", "workers.env"):
            with contextlib.suppress(ModuleNotFoundError):
                importlib.import_module(mod)
        return time.perf_counter() - t0

    def run(self, assignment: dict[str, Any]) -> dict[str, Any]:
        """Trains one rank to completion (or until stopped). Never raises for training errors:
        returns {"status": "error", ...} so the controller can group messages; a dead process
        shows up as RayActorError on this call instead."""
        rank = int(assignment["rank"])
        self._stop.clear()
        self._buf = _Buffer(rank=rank)
        self._assignment = self._last_assignment = assignment
        self._state = "running"
        log_dir = Path(assignment["log_dir"])
        log_dir.mkdir(parents=True, exist_ok=True)
        saved = _ProcessState.capture()
        capture = LogCapture(stdout=log_dir / f"rank-{rank}.stdout",
                             stderr=log_dir / f"rank-{rank}.stderr", sink=self._buf.log)
        capture.start()
        try:
            return self._train(assignment, log_dir=log_dir)
        finally:
            capture.stop()
            self._jobs_run += 1
            self._assignment = None
            saved.restore()

    def _train(self, assignment: dict[str, Any], *, log_dir: Path) -> dict[str, Any]:
        rank = int(assignment["rank"])
        t0 = time.time()
        try:
            spec = _parse_spec(assignment["spec"])
            _apply_rank_env(spec, assignment)
            fn = _load(assignment.get("train_fn") or "workers.loop:run_training")
            callbacks = _ActorCallbacks(self._buf, log_dir / f"rank-{rank}.log")
            kwargs: dict[str, Any] = {"out_dir": assignment["run_dir"], "callbacks": callbacks,
                                      "stop_event": self._stop}
            if assignment.get("steps") is not None:
                kwargs["steps"] = assignment["steps"]
            kwargs["attempt"] = int(assignment.get("attempt", 1))
            params = inspect.signature(fn).parameters
            result = fn(spec, **{k: v for k, v in kwargs.items() if k in params})
            self._state = "stopped" if self._stop.is_set() else "completed"
            return {"status": self._state, "rank": rank, "last_step": self._buf.last_step,
                    "seconds": time.time() - t0, "result": _jsonable(result)}
        except BaseException as exc:  # noqa: BLE001 - reported to the controller, not swallowed
            self._state = "error"
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            sys.stderr.flush()
            return {"status": "error", "rank": rank, "error_type": type(exc).__name__,
                    "message": str(exc) or type(exc).__name__, "traceback": tb,
                    "last_step": self._buf.last_step, "seconds": time.time() - t0}

    @ray.method(concurrency_group="control")
    def poll(self) -> dict[str, Any]:
        out = self._buf.drain()
        out["state"] = self._state
        return out

    @ray.method(concurrency_group="control")
    def stop(self) -> None:
        self._stop.set()

    @ray.method(concurrency_group="control")
    def ping(self) -> str:
        return self._state

    @ray.method(concurrency_group="control")
    def check_clean(self) -> dict[str, Any]:
        """May this actor run another job? (warm pool; see orchestrator/pool.py)"""
        reasons = []
        if self._state not in ("idle", "completed"):
            reasons.append(f"last run ended {self._state}")
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                reasons.append("a process group is still initialised")
        except ImportError:
            pass
        extra = [t.name for t in threading.enumerate()
                 if not t.daemon and t is not threading.main_thread()
                 and t.ident not in self._baseline_threads]
        if extra:
            reasons.append(f"non-daemon threads left: {extra}")
        return {"clean": not reasons, "reasons": reasons, "jobs_run": self._jobs_run,
                "pid": os.getpid()}

    @ray.method(concurrency_group="diag")
    def diagnostics(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evidence for the hang watchdog: stacks of every thread, the last heartbeat and,
        when the watchdog module is present, its richer evidence (Flight Recorder dump)."""
        out: dict[str, Any] = {"rank": self._buf.rank, "pid": os.getpid(),
                               "heartbeat": self._buf.heartbeat, "state": self._state,
                               "stacks": _thread_stacks()}
        try:
            from workers.diagnostics import collect_evidence
        except ImportError:
            return out
        # After a failed run the Flight Recorder still holds what this rank ran (evidence for
        # the hang watchdog when a peer aborted it); the assignment says where to write.
        a = self._assignment or self._last_assignment
        hb, req = self._buf.heartbeat or {}, dict(request or {})
        if a is None:
            return out  # not running a job: nothing to collect
        rank, log_dir = int(a["rank"]), Path(a["log_dir"])
        try:
            out["evidence"] = _jsonable(collect_evidence(
                a["run_dir"], rank, stamp=req.get("stamp"), step=hb.get("step"),
                phase=hb.get("phase"), fr_stack_traces=bool(req.get("fr_stack_traces")),
                log_paths=tuple(str(log_dir / f"rank-{rank}.{s}") for s in ("stdout", "stderr"))))
        except Exception as exc:  # noqa: BLE001 - diagnostics never raise
            out["evidence_error"] = f"{type(exc).__name__}: {exc}"
        return out


class _ProcessState:
    """What a job may change in this process, restored after it (warm-pool isolation)."""

    def __init__(self, env: dict[str, str], cwd: str, modules: set[str],
                 threads: int | None) -> None:
        self.env, self.cwd, self.modules, self.threads = env, cwd, modules, threads

    @classmethod
    def capture(cls) -> _ProcessState:
        threads = None
        if "torch" in sys.modules:
            threads = sys.modules["torch"].get_num_threads()
        return cls(dict(os.environ), os.getcwd(), set(sys.modules), threads)

    def restore(self) -> None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group shows up in check_clean
            pass
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        if self.threads is not None:
            sys.modules["torch"].set_num_threads(self.threads)
        # Modules under a top-level package the process did not have before the job are
        # the job's own code (an import-path model): drop them so the next job re-imports.
        tops = {m.partition(".")[0] for m in self.modules}
        for name in [m for m in sys.modules if m not in self.modules]:
            if name.partition(".")[0] not in tops:
                sys.modules.pop(name, None)


def _apply_rank_env(spec: Any, assignment: dict[str, Any]) -> None:
    from workers.env import apply_env, worker_env

    env = worker_env(spec, run_dir=assignment["run_dir"], **assignment["dist"])
    env.update({k: str(v) for k, v in assignment.get("env", {}).items()})
    apply_env(env, run_dir=assignment["run_dir"])


def _parse_spec(data: dict[str, Any]) -> Any:
    from orchestrator.spec import parse_spec

    return parse_spec(data)


def _thread_stacks() -> dict[str, str]:
    names = {t.ident: t.name for t in threading.enumerate()}
    return {f"{names.get(tid, '?')}({tid})": "".join(traceback.format_stack(frame))
            for tid, frame in sys._current_frames().items()}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return _jsonable(value.to_dict())
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return _jsonable(asdict(value))
    return repr(value)
