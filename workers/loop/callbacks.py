"""The one callback interface between the training loop and whoever hosts it.

The loop (``workers.loop.train.run_training``) reports three things, on every rank:

* ``on_step(metrics)`` once per optimizer step, from the training thread, at the loop's sync
  steps (workers/loop/stepsync.py: the rows since the last sync, in order). ``metrics`` is a
  plain dict (JSON-serialisable) with at least ``step, loss, time, tokens_per_s, step_time_s,
  grad_norm``; ``loss`` is the global mean over every data-parallel rank, so it is identical
  on all ranks.
* ``on_step_pending(metrics)`` (optional: hosts without it are skipped) as soon as a step is
  done, before its sync: the same row without ``loss``. A host that must not lose a step to a
  crash between syncs keeps it (the Ray worker actor appends it to its run-dir file).
* ``on_heartbeat(hb)`` every ``heartbeat_interval_s`` from a side thread
  (``workers.loop.heartbeat``), also while the training thread is blocked inside a collective
  or in user code — a stuck rank keeps reporting the phase and collective sequence numbers
  where it is stuck.
* ``on_log(level, message)`` for setup / checkpoint / fault events.
* ``on_checkpoint(info)`` (optional: hosts without it are skipped, see ``report_checkpoint``)
  on rank 0 when a checkpoint is complete: ``step, path, size_bytes, time, kept`` (the steps
  still on disk after pruning).

Hosts: the torchrun launcher (``FileCallbacks``: metrics.jsonl from rank 0 plus one
heartbeat file per rank), the Ray worker actor (forwards to the controller), tests.
Callbacks must be cheap and must not raise; the loop does not guard them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from workers.host.logcapture import private_opener


class Phase(StrEnum):
    SETUP = "setup"
    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    CHECKPOINT = "checkpoint"
    DONE = "done"


@dataclass(frozen=True)
class CollectiveSeq:
    """Flight Recorder view of one process group on this rank."""

    last_enqueued: int
    last_completed: int
    last_started: int = -1


@dataclass(frozen=True)
class Heartbeat:
    """Where one rank is. ``step`` is the step being run (1-based; 0 during setup).
    ``start_step`` is the step the run resumed from (0 on a fresh start): the steps up to it
    were completed by an earlier attempt, so running ``start_step + 1`` shows none completed
    by this one."""

    rank: int
    step: int
    phase: Phase
    time: float
    phase_since: float
    collectives: dict[str, CollectiveSeq] = field(default_factory=dict)
    pid: int = field(default_factory=os.getpid)
    start_step: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase"] = self.phase.value
        return d


@runtime_checkable
class TrainingCallbacks(Protocol):
    def on_step(self, metrics: dict[str, Any]) -> None: ...

    def on_heartbeat(self, hb: Heartbeat) -> None: ...

    def on_log(self, level: str, message: str) -> None: ...


def report_checkpoint(callbacks: TrainingCallbacks, info: dict[str, Any]) -> None:
    """Calls ``callbacks.on_checkpoint(info)`` when the host has it."""
    hook = getattr(callbacks, "on_checkpoint", None)
    if hook is not None:
        hook(info)


class NullCallbacks:
    def on_step(self, metrics: dict[str, Any]) -> None:
        pass

    def on_heartbeat(self, hb: Heartbeat) -> None:
        pass

    def on_log(self, level: str, message: str) -> None:
        pass

    def on_checkpoint(self, info: dict[str, Any]) -> None:
        pass


class CompositeCallbacks:
    def __init__(self, callbacks: Sequence[TrainingCallbacks]) -> None:
        self._cbs = list(callbacks)

    def on_step(self, metrics: dict[str, Any]) -> None:
        for cb in self._cbs:
            cb.on_step(metrics)

    def on_heartbeat(self, hb: Heartbeat) -> None:
        for cb in self._cbs:
            cb.on_heartbeat(hb)

    def on_log(self, level: str, message: str) -> None:
        for cb in self._cbs:
            cb.on_log(level, message)

    def on_checkpoint(self, info: dict[str, Any]) -> None:
        for cb in self._cbs:
            report_checkpoint(cb, info)

    def on_step_pending(self, metrics: dict[str, Any]) -> None:
        for cb in self._cbs:
            hook = getattr(cb, "on_step_pending", None)
            if hook is not None:
                hook(metrics)


class FileCallbacks:
    """Writes ``out_dir/metrics.jsonl`` (rank 0 only), ``out_dir/heartbeats/rank_<r>.json``
    (latest heartbeat, replaced atomically) and ``out_dir/logs/rank_<r>.log``.

    This is what the torchrun launcher uses; the files are also what tests read.
    """

    def __init__(self, out_dir: str | Path, *, rank: int) -> None:
        self._rank = rank
        out = Path(out_dir)
        (out / "heartbeats").mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self._hb_path = out / "heartbeats" / f"rank_{rank}.json"
        self._log = open(out / "logs" / f"rank_{rank}.log", "a", buffering=1,  # noqa: SIM115
                         opener=private_opener)
        self._metrics = open(out / "metrics.jsonl", "a", buffering=1,  # noqa: SIM115
                             opener=private_opener) if rank == 0 else None
        self._lock = threading.Lock()

    def on_step(self, metrics: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(metrics) + "\n")

    def on_heartbeat(self, hb: Heartbeat) -> None:
        tmp = self._hb_path.with_suffix(".tmp")
        with self._lock:
            tmp.write_text(json.dumps(hb.to_dict()))
            os.replace(tmp, self._hb_path)

    def on_log(self, level: str, message: str) -> None:
        with self._lock:
            self._log.write(f"{level} {message}\n")

    def on_checkpoint(self, info: dict[str, Any]) -> None:
        self.on_log("INFO", f"checkpoint complete: {json.dumps(info)}")

    def close(self) -> None:
        self._log.close()
        if self._metrics is not None:
            self._metrics.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Reads a metrics.jsonl file (a file or the run dir holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
