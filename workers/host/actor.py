"""The Ray actor that hosts one rank: thin glue around the workers core.

The controller creates one `WorkerActor` per placement-group bundle, asks it where it landed
(`info`: Ray node id, GPU ids, IP), then calls `run(assignment)` with a typed
`workers.host.assignment.RankAssignment`, which

1. applies the rank environment (``workers.host.env.worker_env``: RANK, WORLD_SIZE,
   MASTER_ADDR/PORT, NCCL and Flight Recorder variables),
2. redirects this process's stdout / stderr (file descriptors 1 and 2, so C++ output from gloo
   or NCCL is captured too) to ``<run_dir>/logs/attempt-<n>/rank-<r>.{stdout,stderr}``,
3. runs the training function (``workers.loop.train:run_training`` unless the assignment names
   another import path) in the actor's default thread, and returns a `RankResult`: completed,
   stopped, or an error with the exception type, message and traceback.

While it runs, the controller drains `poll()` (a `WorkerPoll`: heartbeat, metrics, log lines)
and may call
`stop()`; both live in the "control" concurrency group so they are served while the training
thread is busy. `diagnostics()` has its own group ("diag") so a hang investigation is never
queued behind a poll.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import ray

from orchestrator.isolation.modes import JobConfinement
from orchestrator.isolation.worker_env import is_allowed
from orchestrator.spec import SpecKind
from orchestrator.storage.object_storage import ObjectStorage
from workers.host.assignment import (
    RankAssignment,
    RankBeat,
    RankResult,
    WorkerPoll,
    WorkerState,
)
from workers.host.forkserver import apply_thread_counts
from workers.host.logcapture import LogCapture, private_opener
from workers.host.rankproc import PrestartedRank, StopRequest, alive, become_subreaper
from workers.host.sampling import ProcessSampler

_MAX_BUFFERED_LOGS = 20_000
_MAX_BUFFERED_METRICS = 100_000


class _Buffer:
    """What the training thread reports, drained by the controller's polls (thread-safe)."""

    def __init__(self, rank: int, *, metrics_file: Path | None = None) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        # Every reported row is also appended here (line-buffered: a row is in the file once
        # metric() returns, whatever happens to this process or the control plane after), so
        # the control plane can recover what no poll fetched (runtime/metrics_files.py).
        self._metrics_path = metrics_file
        self._metrics_out: Any = None
        self._metrics: deque[dict[str, Any]] = deque(maxlen=_MAX_BUFFERED_METRICS)
        self._logs: deque[dict[str, Any]] = deque(maxlen=_MAX_BUFFERED_LOGS)
        self._dropped_logs = 0
        self._checkpoints: list[dict[str, Any]] = []
        self.heartbeat: RankBeat | None = None
        self.last_step: int | None = None

    def metric(self, row: dict[str, Any]) -> None:
        with self._lock:
            kept = dict(row, rank=self.rank)
            self._metrics.append(kept)
            self.last_step = row.get("step", self.last_step)
            self._keep(kept)

    def pending(self, row: dict[str, Any]) -> None:
        """A finished step's row before its sync (no ``loss`` yet): only into the file, so a
        rank that dies before the sync leaves it for the control plane; the full row follows
        at the sync (metric()) and the reader merges the two (runtime/metrics_files.py)."""
        with self._lock:
            self._keep(dict(row, rank=self.rank))

    def _keep(self, row: dict[str, Any]) -> None:
        if self._metrics_path is None:
            return
        try:
            if self._metrics_out is None:
                self._metrics_path.parent.mkdir(parents=True, exist_ok=True)
                self._metrics_out = open(self._metrics_path, "a", buffering=1,  # noqa: SIM115
                                         opener=private_opener)
            self._metrics_out.write(json.dumps(row, default=str) + "\n")
        except OSError:
            self._metrics_path = None  # a full disk must not stop training; polls still work

    def close(self) -> None:
        with self._lock:
            out, self._metrics_out = self._metrics_out, None
            if out is not None:
                # its last buffered line may not fit on a full disk: the rank's result, not
                # this file, is what the run call must return
                with contextlib.suppress(OSError):
                    out.close()

    def log(self, stream: str, line: str) -> None:
        with self._lock:
            if len(self._logs) == self._logs.maxlen:
                self._dropped_logs += 1
            self._logs.append({"rank": self.rank, "stream": stream, "line": line,
                               "time": time.time()})

    def checkpoint(self, info: dict[str, Any]) -> None:
        with self._lock:
            self._checkpoints.append(dict(info))

    def drain(self, state: WorkerState, usage: dict[str, Any] | None = None) -> WorkerPoll:
        with self._lock:
            out = WorkerPoll(state=state, metrics=tuple(self._metrics), logs=tuple(self._logs),
                             heartbeat=self.heartbeat, last_step=self.last_step,
                             dropped_logs=self._dropped_logs, usage=usage,
                             checkpoints=tuple(self._checkpoints))
            self._metrics.clear()
            self._logs.clear()
            self._checkpoints.clear()
            self._dropped_logs = 0
        return out


class _ActorCallbacks:
    """The loop's callbacks (see workers/loop/callbacks.py), forwarding into the poll buffer."""

    def __init__(self, buf: _Buffer, log_file: Path) -> None:
        self._buf = buf
        self._log_file = log_file

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._buf.metric(metrics)

    def on_step_pending(self, metrics: dict[str, Any]) -> None:
        self._buf.pending(metrics)

    def on_heartbeat(self, hb: Any) -> None:
        self._buf.heartbeat = RankBeat.of(hb)

    def on_checkpoint(self, info: dict[str, Any]) -> None:
        self._buf.checkpoint(info)

    def on_log(self, level: str, message: str) -> None:
        self._buf.log("log", f"{level} {message}")
        with open(self._log_file, "a", opener=private_opener) as f:
            f.write(f"{time.strftime('%H:%M:%S')} {level} {message}\n")


@ray.remote(concurrency_groups={"control": 2, "diag": 1, "storage": 1})  # type: ignore[call-overload]
class WorkerActor:
    """One rank. Ray restarts nothing here: a dead actor is a failed attempt."""

    def __init__(self) -> None:
        # A job sees an explicit environment: the allowlist of orchestrator/isolation/worker_env.py
        # (PATH, locale, CUDA_*, NCCL_*, RAY_*, ...), then its rank's own variables. Whatever
        # else the node's environment holds stays out of the job's reach. Only the others are
        # unset: Ray's threads run already, and rewriting the whole environment (setenv after
        # setenv, the C array reallocated) races with their getenv.
        for name in [k for k in os.environ if not is_allowed(k)]:
            del os.environ[name]
        apply_thread_counts()  # forked from the fork server: torch is imported already
        self._stop = StopRequest()
        self._buf = _Buffer(rank=-1)
        self._state = WorkerState.IDLE
        self._assignment: RankAssignment | None = None
        self._last_assignment: RankAssignment | None = None  # diagnostics after a failed run
        self._jobs_run = 0
        self._baseline_threads = {t.ident for t in threading.enumerate()}
        # Where Ray's working_dir (an uploaded package) put this process: the code is below.
        self._start_cwd = os.getcwd()
        become_subreaper()  # a user job's orphaned grandchildren come back to this actor
        self._usage: ProcessSampler | None = None
        # A pooled actor's next user-code rank process, started before its job (warm()).
        self._prestart: PrestartedRank | None = None
        self._confinement: JobConfinement | None = None  # what its next job's ranks get

    @ray.method(concurrency_group="control")
    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
                "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "hostname": socket.gethostname(), "jobs_run": self._jobs_run}

    @ray.method(concurrency_group="control")
    def free_port(self) -> int:
        """A port free on this node now, for MASTER_PORT when this actor is rank 0."""
        from workers.host.env import free_port

        return free_port(ray.util.get_node_ip_address())

    @ray.method(concurrency_group="control")
    def warm(self, *, prestart: bool = True, ready_s: float = 60.0,
             confinement: JobConfinement | None = None) -> dict[str, float]:
        """Imports torch and the workers core now and, with `prestart`, starts the rank
        process of a user-code job (meshyard/_prestart.py), so a pooled actor starts either
        kind of job fast. No CUDA call: an idle actor holds no GPU memory. Returns the
        seconds it took and the resident memory of this process and its prestarted one,
        waiting up to `ready_s` for the latter's imports (a slower one is kept: a job only
        waits longer for it)."""
        t0 = time.perf_counter()
        import torch  # noqa: F401

        for mod in ("workers.loop.train", "workers.host.env", "workers.usercode.rank"):
            importlib.import_module(mod)
        self._confinement = confinement
        if prestart:
            self._prestart_next()
        if self._prestart is not None and not self._prestart.wait_ready(timeout_s=ready_s) \
                and self._prestart.pid is not None and not alive(self._prestart.pid):
            self._prestart.close()
            self._prestart = None
        return {"seconds": time.perf_counter() - t0, "rss_bytes": float(self._rss())}

    def _prestart_next(self) -> None:
        """Starts the next prestarted rank process (from a "control" thread: those live as
        long as the actor, see PrestartedRank.spawn)."""
        if self._prestart is not None:
            return
        net = self._net_layer()
        # the one the fork server forked with this actor, else one started now
        self._prestart = PrestartedRank.preforked(net=net)
        if self._prestart is not None:
            return
        try:
            self._prestart = PrestartedRank.spawn(python=sys.executable, env=os.environ,
                                                  cwd=self._start_cwd, net=net)
        except OSError:
            self._prestart = None  # user-code jobs start their rank cold then

    def _net_layer(self) -> tuple[int, tuple[int, ...]] | None:
        """The TCP layer a prestarted rank process confines itself with (the ports a job's
        confinement on this node closes); None when jobs are not confined here."""
        job = self._confinement
        if job is None or not job.confined:
            return None
        from workers.host.confinement import Unconfinable, node_share, port_layer

        try:
            ports = tuple(sorted({*node_share().ports, *job.denied_ports}))
            return port_layer(ports), ports
        except (Unconfinable, OSError):
            return None  # the rank fails with the reason when a job comes

    def _rss(self) -> int:
        import psutil

        rss = psutil.Process().memory_info().rss
        pid = self._prestart.pid if self._prestart is not None else None
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                rss += psutil.Process(pid).memory_info().rss
        return int(rss)

    def run(self, assignment: RankAssignment) -> RankResult:
        """Trains one rank to completion (or until stopped). Never raises for training errors:
        returns an ERROR result so the controller can group messages; a dead process shows up
        as RayActorError on this call instead. The result is also kept for `result()`: a
        caller whose connection to this actor broke while it ran asks again."""
        self._result: RankResult | None = None
        self._result = self._run(assignment)
        return self._result

    @ray.method(concurrency_group="control")
    def result(self) -> RankResult | None:
        """The last run's result; None while it runs (or before any)."""
        return getattr(self, "_result", None)

    def _run(self, assignment: RankAssignment) -> RankResult:
        rank = assignment.rank
        self._stop.reset()
        self._buf = _Buffer(rank=rank, metrics_file=assignment.log_path("metrics.jsonl"))
        self._assignment = self._last_assignment = assignment
        gpus = ray.get_gpu_ids() if assignment.visible_gpus is None else assignment.visible_gpus
        if self._usage is None or assignment.visible_gpus is not None:
            self._usage = ProcessSampler(gpu_index=int(gpus[0]) if gpus else None)
        self._state = WorkerState.RUNNING
        Path(assignment.log_dir).mkdir(parents=True, exist_ok=True)
        saved = _ProcessState.capture()
        if assignment.visible_gpus is not None:
            # What Ray sets for a cold actor with these GPUs; no CUDA call has been made
            # in this process yet (warm() makes none), so it takes effect.
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, assignment.visible_gpus))
        capture = LogCapture(stdout=assignment.log_path("stdout"),
                             stderr=assignment.log_path("stderr"), beneath=assignment.run_dir,
                             sink=self._buf.log)
        capture.start()
        try:
            if assignment.spec.kind is SpecKind.USER_CODE:
                return self._run_user(assignment)
            return self._train(assignment)
        finally:
            capture.stop()
            self._buf.close()
            self._jobs_run += 1
            self._assignment = None
            saved.restore()

    def _train(self, a: RankAssignment) -> RankResult:
        t0 = time.time()
        try:
            _apply_rank_env(a)
            from workers.host.evidence import mark_training_thread
            from workers.loop.train import run_training

            mark_training_thread()  # the stacks evidence names this thread, not the actor's
            callbacks = _ActorCallbacks(self._buf, a.log_path("log"))
            result = run_training(a.spec, out_dir=a.run_dir, callbacks=callbacks,
                                  checkpoint_dir=a.checkpoint_root,
                                  checkpoint_store=a.checkpoint_store,
                                  stop_event=self._stop, attempt=a.attempt,
                                  preflight_links=a.preflight_links)
            self._state = WorkerState.STOPPED if self._stop.is_set() else WorkerState.COMPLETED
            return RankResult(rank=a.rank, state=self._state, last_step=self._buf.last_step,
                              seconds=time.time() - t0, result=_jsonable(result))
        except BaseException as exc:  # noqa: BLE001 - reported to the controller, not swallowed
            self._state = WorkerState.ERROR
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            sys.stderr.flush()
            return RankResult(rank=a.rank, state=WorkerState.ERROR,
                              error_type=type(exc).__name__,
                              message=str(exc) or type(exc).__name__, traceback=tb,
                              last_step=self._buf.last_step, seconds=time.time() - t0)

    def _run_user(self, a: RankAssignment) -> RankResult:
        """A user-code rank: one child process (workers/usercode/rank.py); never raises."""
        from workers.usercode.rank import run_user_rank, unpack_package

        prestarted, self._prestart = self._prestart, None
        try:
            # Where Ray's working_dir would have put this actor: the package's root.
            root = self._start_cwd if a.package_uri is None else \
                str(unpack_package(a.package_uri, base=Path(a.run_dir) / "code"))
            result = run_user_rank(a, sink=self._buf, stop=self._stop, actor_cwd=root,
                                   prestarted=prestarted)
        except Exception as exc:  # noqa: BLE001 - reported to the controller, not swallowed
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            result = RankResult(rank=a.rank, state=WorkerState.ERROR,
                                error_type=type(exc).__name__, message=str(exc), traceback=tb)
        finally:
            if prestarted is not None:
                prestarted.close()  # not handed (the rank started cold): never reused
        self._state = result.state
        return result

    @ray.method(concurrency_group="control")
    def poll(self) -> WorkerPoll:
        usage = self._usage.sample() if self._usage is not None else None
        return self._buf.drain(self._state, usage=usage)

    @ray.method(concurrency_group="control")
    def stop(self, grace_s: float | None = None) -> None:
        """Ends the run: the built-in loop after its next step (with a checkpoint), a
        user-code rank by SIGTERM, then SIGKILL after `grace_s` (default 3 s)."""
        self._stop.request(grace_s)

    @ray.method(concurrency_group="control")  # type: ignore[arg-type]
    def send_probe(self, addr: str, port: int, tag: str, *, nbytes: int,
                   seconds: float) -> int:
        """Zeros to the controller's link-probe sink (orchestrator/runtime/link_probe.py)."""
        from workers.host.link_probe import send_probe

        return send_probe(addr, port, tag, nbytes=nbytes, seconds=seconds)

    @ray.method(concurrency_group="storage")  # type: ignore[arg-type]
    def upload_checkpoint(self, storage: ObjectStorage, *, job_id: str, run_dir: str, step: int,
                          keep: int) -> dict[str, Any]:
        """This host's part of a complete checkpoint, to the store (checkpoint_transfer.py)."""
        from workers.host.checkpoint_transfer import upload_step

        return upload_step(storage, job_id=job_id, run_dir=run_dir, step=step, keep=keep)

    @ray.method(concurrency_group="storage")  # type: ignore[arg-type]
    def restore_checkpoint(self, storage: ObjectStorage, *, job_id: str, run_dir: str,
                           step: int | None) -> dict[str, Any]:
        """The job's checkpoint folder on this host: emptied, then the store's `step`."""
        from workers.host.checkpoint_transfer import restore_step

        return restore_step(storage, job_id=job_id, run_dir=run_dir, step=step)

    @ray.method(concurrency_group="control")
    def ping(self) -> str:
        return self._state

    @ray.method(concurrency_group="control")
    def check_clean(self, *, prestart: bool = True) -> dict[str, Any]:
        """May this actor run another job? (warm pool; see orchestrator/runtime/pool.py)
        If so, and with `prestart`, its next prestarted rank process starts now."""
        reasons = []
        if self._state not in (WorkerState.IDLE, WorkerState.COMPLETED):
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
        if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
            # CUDA_VISIBLE_DEVICES took effect at the first CUDA call: this process keeps
            # the last job's GPUs (and their memory) for good.
            reasons.append("a CUDA context exists")
        if not reasons and prestart:
            self._prestart_next()  # the last one became a user-code rank
        return {"clean": not reasons, "reasons": reasons, "jobs_run": self._jobs_run,
                "pid": os.getpid(), "rss_bytes": self._rss()}

    @ray.method(concurrency_group="diag")
    def diagnostics(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evidence for the hang watchdog: stacks of every thread, the last heartbeat and the
        richer evidence of `workers.host.evidence` (Flight Recorder dump, NCCL log errors).
        `request["kind"] == "stacks"` ("stacks now") answers with the stacks alone.
        `served_s`: the seconds this call took here (the caller tells the network's share of
        its wait from the time gathering evidence took)."""
        t0 = time.monotonic()
        out = self._diagnostics(request)
        out["served_s"] = round(time.monotonic() - t0, 3)
        return out

    def _diagnostics(self, request: dict[str, Any] | None) -> dict[str, Any]:
        from workers.host.evidence import collect_evidence, pyspy_dump, thread_stack_map

        out: dict[str, Any] = {"rank": self._buf.rank, "pid": os.getpid(),
                               "heartbeat": self._buf.heartbeat, "state": self._state}
        # After a failed run the Flight Recorder still holds what this rank ran (evidence for
        # the hang watchdog when a peer aborted it); the assignment says where to write.
        a = self._assignment or self._last_assignment
        hb, req = self._buf.heartbeat, dict(request or {})
        if a is not None and a.spec.kind is SpecKind.USER_CODE:
            return self._user_diagnostics(a, out, req)
        out["stacks"] = thread_stack_map()
        if req.get("kind") == "stacks":
            native = pyspy_dump()  # native frames too, where py-spy is installed
            if native is not None:
                out["native"] = native
            return out
        if a is None:
            return out  # not running a job: nothing to collect
        try:
            out["evidence"] = _jsonable(collect_evidence(
                a.run_dir, a.rank, stamp=req.get("stamp"), step=hb.step if hb else None,
                phase=hb.phase if hb else None, fr_stack_traces=bool(req.get("fr_stack_traces")),
                native=req.get("native") is not False,
                log_paths=tuple(str(a.log_path(s)) for s in ("stdout", "stderr"))))
        except Exception as exc:  # noqa: BLE001 - diagnostics never raise
            out["evidence_error"] = f"{type(exc).__name__}: {exc}"
        return out

    def _user_diagnostics(self, a: RankAssignment, out: dict[str, Any],
                          req: dict[str, Any]) -> dict[str, Any]:
        """User code: its threads and torch state live in the rank process, not in this
        actor, whose own stacks would mislead; the probe inside that process answers."""
        if self._state != WorkerState.RUNNING:
            return out
        from workers.usercode.rank import rank_evidence

        try:
            ev = rank_evidence(a, request=req, heartbeat=self._buf.heartbeat)
        except Exception as exc:  # noqa: BLE001 - diagnostics never raise
            out["evidence_error"] = f"{type(exc).__name__}: {exc}"
            return out
        if ev is None:
            out["evidence_error"] = "the rank process's probe did not answer"
            return out
        out["stacks"] = dict(ev.get("stacks") or {})
        native = ev.pop("native", None)  # "stacks now" shows it; a diagnosis has the file
        if isinstance(native, str) and req.get("kind") == "stacks":
            out["native"] = native
        if req.get("kind") != "stacks":
            ev.pop("stacks", None)
            out["evidence"] = _jsonable(ev)
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
            if "torch" in sys.modules:  # a user-code run never imports torch in the actor
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


def _apply_rank_env(a: RankAssignment) -> None:
    from workers.host.env import apply_env, worker_env

    env = worker_env(a.spec, run_dir=a.run_dir, **a.dist.as_kwargs())
    env.update({k: str(v) for k, v in a.env.items()})
    apply_env(env, run_dir=a.run_dir)


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
