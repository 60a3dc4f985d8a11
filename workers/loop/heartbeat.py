"""Progress tracking and the heartbeat side thread.

The training thread only writes two attributes per phase change (:meth:`Progress.enter`), so
the per-step cost is a few hundred nanoseconds. A daemon thread wakes every
``interval_s``, reads the progress and the Flight Recorder's per-group sequence numbers, and
calls ``callbacks.on_heartbeat``. Because it is a separate thread, a rank blocked inside a
collective or in user code keeps reporting *where* it is blocked.
"""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

from workers.loop.callbacks import CollectiveSeq, Heartbeat, Phase, TrainingCallbacks


class Progress:
    """Step and phase of this rank; written by the training thread, read by the heartbeat."""

    def __init__(self) -> None:
        self.step = 0
        self.start_step = 0  # the checkpoint's step this run resumed from
        self.phase = Phase.SETUP
        self.since = time.time()
        # Per group, a collective seq known to be completed (see settle_collectives).
        self.completed_floor: dict[str, int] = {}
        # Groups (Flight Recorder names) whose collectives run outside the training thread's
        # step, across step boundaries (the async checkpoint's): never floored.
        self.background_groups: frozenset[str] = frozenset()

    def settle_collectives(self) -> None:
        """Called by the training thread where every collective enqueued so far on a training
        group has been waited for (a step's start, the end of its backward), so whatever is
        enqueued is completed. Gloo's ``last_completed_collective`` alone can say otherwise
        for good: its two worker threads each write the watermark after completing a work,
        so a thread preempted between the two can write an older seq after a newer one (seen
        under load: a rank blocked in user code that still showed one collective pending)."""
        self.completed_floor = {pg: s.last_enqueued for pg, s in collective_seqs().items()
                                if pg not in self.background_groups}

    def enter(self, phase: Phase, step: int | None = None) -> None:
        if step is not None:
            self.step = step
        self.phase = phase
        self.since = time.time()


def collective_seqs(completed_floor: dict[str, int] | None = None) -> dict[str, CollectiveSeq]:
    """Last enqueued / started / completed collective seq per process group, from the Flight
    Recorder (empty when it is off or torch lacks it). About 10 us on gloo.

    ``completed_floor`` raises a group's last completed seq to a value known to be completed
    (never above the last enqueued one)."""
    try:
        import torch

        raw = torch._C._distributed_c10d._dump_fr_trace(  # type: ignore[attr-defined]
            includeCollectives=False, includeStackTraces=False)
        status = pickle.loads(raw).get("pg_status", {})
    except Exception:  # noqa: BLE001 - heartbeats never fail the job
        return {}
    floor = completed_floor or {}
    out: dict[str, CollectiveSeq] = {}
    for pg, s in status.items():
        enq = int(s.get("last_enqueued_collective", -1))
        done = max(int(s.get("last_completed_collective", -1)), floor.get(str(pg), -1))
        out[str(pg)] = CollectiveSeq(last_enqueued=enq, last_completed=min(done, enq),
                                     last_started=int(s.get("last_started_collective", -1)))
    return out


def dump_flight_recorder(path: Path) -> bool:
    """Writes the full Flight Recorder trace (pickle, no stack traces) to ``path`` unless a
    dump is already there. NCCL dumps on timeout by itself (TORCH_FR_DUMP_TEMP_FILE); gloo
    does not, so the loop calls this when a step fails — same ``<prefix><rank>`` file."""
    if path.exists():
        return False
    try:
        import torch

        raw = torch._C._distributed_c10d._dump_fr_trace(  # type: ignore[attr-defined]
            True, False, False)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
    except Exception:  # noqa: BLE001 - best effort evidence on the way out
        return False
    return True


def make_heartbeat(progress: Progress, *, rank: int) -> Heartbeat:
    return Heartbeat(rank=rank, step=progress.step, phase=progress.phase, time=time.time(),
                     phase_since=progress.since, start_step=progress.start_step,
                     collectives=collective_seqs(progress.completed_floor))


class HeartbeatThread:
    """Calls ``callbacks.on_heartbeat`` every ``interval_s`` until :meth:`stop`."""

    def __init__(self, progress: Progress, callbacks: TrainingCallbacks, *, rank: int,
                 interval_s: float = 1.0) -> None:
        self._progress = progress
        self._callbacks = callbacks
        self._rank = rank
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshyard-heartbeat", daemon=True)

    def start(self) -> HeartbeatThread:
        self._thread.start()
        return self

    def beat(self) -> None:
        self._callbacks.on_heartbeat(make_heartbeat(self._progress, rank=self._rank))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()

    def stop(self, *, final_beat: bool = True) -> None:
        """Stops the thread; ``final_beat`` reports the last state (e.g. DONE) once more.

        After an error the caller skips it: a failed collective reads as completed in the
        Flight Recorder, and the last periodic beat (taken while stuck) is the better evidence.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if final_beat and self._interval > 0:
            self.beat()
