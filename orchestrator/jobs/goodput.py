"""The goodput ledger: where a job's wall time went. Pure module.

The job's state transitions cut its wall time (submit -> terminal state, or now) into
contiguous intervals; each interval goes to one bucket, so the buckets add up to the wall
time by construction:

    QUEUED before the first attempt                   queued
    PLACING, STARTING, RUNNING up to the first step   starting (placement, pre-flight, process
      of the first attempt (one window per attempt:     start, first step)
      its steps split it, not the RUNNING event)
    RUNNING, steps no earlier attempt reached         productive (a successful attempt's
                                                        time after its last step too: the final
                                                        checkpoint and exit)
    RUNNING, steps an earlier attempt had reached     recomputed (redone after a restart, from
                                                        the checkpoint on)
    RUNNING, from the last step before a diagnosis    hung (stall to detection, and on while
      to the next step                                  the attempt is live and stuck)
    RUNNING after the last step of a live attempt     productive (the step in progress)
      without a diagnosis
    RUNNING after the diagnosis of an attempt that    recovering
      ended (or after the last step of an attempt
      that failed without one), RESTARTING, and the
      QUEUED / PLACING / STARTING / first step of
      every later attempt
    CANCELLING                                        stopping
    PREEMPTED (stopping for a higher-priority job),   preempted
      the QUEUED wait after it, and the next
      attempt's placement, start and first step

Step times are the ranks' own clocks (rank 0's metric rows: the time each step completed). A
job that reports no steps progresses by the collectives its ranks run: those observations
(`progress`) split its attempts instead.

>>> e = [(0.0, "QUEUED", 0), (2.0, "PLACING", 1), (3.0, "RUNNING", 1), (13.0, "SUCCEEDED", 1)]
>>> g = goodput(events=e, steps={1: [(1, 4.0), (10, 13.0)]}, detections={}, now=20.0)
>>> g.seconds["queued"], g.seconds["starting"], g.seconds["productive"], g.wall_s
(2.0, 2.0, 9.0, 13.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BUCKETS = ("queued", "starting", "productive", "recomputed", "hung", "recovering", "stopping",
           "preempted")
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# An attempt's placement, start and run are one window split by its steps: the RUNNING
# transition is written when the poller sees the first step, which can be after a few steps.
_ATTEMPT_STATES = ("PLACING", "STARTING", "RUNNING")


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    kind: str
    attempt: int

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "kind": self.kind,
                "attempt": self.attempt, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    seconds: Mapping[str, float]
    segments: tuple[Segment, ...]
    steps_recomputed: int

    @property
    def ratio(self) -> float:
        return self.seconds.get("productive", 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 3), "ratio": round(self.ratio, 4),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "steps_recomputed": self.steps_recomputed,
                "segments": [s.to_dict() for s in self.segments]}


def _relabel(segments: list[Segment], a: float, b: float, kind: str) -> list[Segment]:
    """`segments` with [a, b] given to `kind` (the pieces outside it keep theirs)."""
    out: list[Segment] = []
    for seg in segments:
        if seg.end <= a or seg.start >= b:
            out.append(seg)
            continue
        if seg.start < a:
            out.append(Segment(seg.start, a, seg.kind, seg.attempt))
        out.append(Segment(max(seg.start, a), min(seg.end, b), kind, seg.attempt))
        if seg.end > b:
            out.append(Segment(b, seg.end, seg.kind, seg.attempt))
    return out


def _running(start: float, end: float, *, attempt: int, steps: Sequence[tuple[int, float]],
             reached: int, detected: float | None, succeeded: bool, live: bool,
             resumed: bool = False) -> list[Segment]:
    """One attempt's window (PLACING -> its end, or now while `live`) split by its progress
    points (step, completed at). A hang runs from the last progress before its detection to
    the next progress; while the attempt is live and stuck it is still hung, once the attempt
    ended after it the rest is recovering. A live attempt that is not hung is working on its
    next step: productive. `resumed`: the attempt follows a preemption, so its start-up is
    the preemption's cost."""
    inside = sorted((s, t) for s, t in steps if start <= t <= end)
    cut = detected if detected is not None and start <= detected <= end else None
    before = "preempted" if resumed else "starting" if attempt <= 1 else "recovering"
    after_cut = "hung" if live else "recovering"
    if not inside:
        if cut is not None:  # it never progressed: the first-step threshold fired
            return [Segment(start, cut, before, attempt), Segment(cut, end, after_cut,
                                                                   attempt)]
        return [Segment(start, end, "productive" if succeeded else before, attempt)]
    first_t, last_t = inside[0][1], inside[-1][1]
    out = [Segment(start, first_t, before, attempt)]
    fresh = next((t for s, t in inside if s > reached), None)
    if fresh is None:  # every step of this interval was a redo
        out.append(Segment(first_t, last_t, "recomputed", attempt))
    else:
        # the first fresh step's own time was spent on a new step: the redo ends at the
        # completion of the last redone step
        redo_end = max((t for s, t in inside if s <= reached), default=first_t)
        out.append(Segment(first_t, redo_end, "recomputed", attempt))
        out.append(Segment(redo_end, last_t, "productive", attempt))
    if cut is not None and cut >= last_t:
        out += [Segment(last_t, cut, "hung", attempt), Segment(cut, end, after_cut, attempt)]
    elif succeeded or live:
        out.append(Segment(last_t, end, "productive", attempt))
    else:
        out.append(Segment(last_t, end, "recovering", attempt))
    if cut is not None and cut < last_t:
        # progress resumed after the diagnosis: the hang is the gap around it
        prev = max((t for _, t in inside if t <= cut), default=start)
        nxt = min(t for _, t in inside if t > cut)
        out = _relabel(out, prev, nxt, "hung")
    return out


def goodput(*, events: Sequence[tuple[float, str, int]],
            steps: Mapping[int, Sequence[tuple[int, float]]],
            detections: Mapping[int, float], now: float,
            progress: Mapping[int, Sequence[tuple[int, float]]] | None = None) -> Goodput:
    """`events`: (time, state entered, current attempt number) in order; `steps`: per
    attempt, rank 0's (step, completed at); `detections`: per attempt, when the first hang
    was diagnosed; `progress`: per attempt, (collective count, observed at) from the probe
    of a job that reports no steps, which stand in for steps of an attempt without any
    (a count is never a redo: counts restart with each attempt)."""
    progress = progress or {}
    segments: list[Segment] = []
    reached = 0  # the highest step any earlier attempt completed
    seen_attempts: list[int] = []
    preempted = False  # the last attempt was stopped for another job
    i = 0
    while i < len(events):
        at, state, attempt = events[i]
        if state in TERMINAL:
            break
        j = i + 1
        if state in _ATTEMPT_STATES:  # one window: placement -> the attempt's end
            while j < len(events) and events[j][1] in _ATTEMPT_STATES \
                    and events[j][2] == attempt:
                j += 1
        end = events[j][0] if j < len(events) else now
        nxt = events[j][1] if j < len(events) else None
        if attempt and attempt not in seen_attempts:
            seen_attempts.append(attempt)
            reached = max((s for a in seen_attempts[:-1] for s, _ in steps.get(a, ())),
                          default=0)
        first = len(seen_attempts) <= 1
        if state == "QUEUED":
            segments.append(Segment(at, end, "preempted" if preempted else
                                    "queued" if attempt == 0 else "recovering", attempt))
        elif state in _ATTEMPT_STATES:
            own = steps.get(attempt, ())
            segments += _running(at, end, attempt=attempt, steps=own or progress.get(attempt, ()),
                                 reached=0 if first or not own else reached,
                                 detected=detections.get(attempt),
                                 # a stop for another job ends the step in progress
                                 succeeded=nxt in ("SUCCEEDED", "PREEMPTED"),
                                 live=nxt is None, resumed=preempted)
            preempted = False
        elif state == "CANCELLING":
            segments.append(Segment(at, end, "stopping", attempt))
        elif state == "PREEMPTED":
            segments.append(Segment(at, end, "preempted", attempt))
            preempted = True
        else:  # RESTARTING
            segments.append(Segment(at, end, "recovering", attempt))
        i = j
    segments = [s for s in segments if s.end > s.start]
    seconds = dict.fromkeys(BUCKETS, 0.0)
    for s in segments:
        seconds[s.kind] += s.seconds
    wall = (segments[-1].end - segments[0].start) if segments else 0.0
    redone = sum(1 for i, a in enumerate(seen_attempts[1:], 1)
                 for s, _ in steps.get(a, ())
                 if s <= max((x for b in seen_attempts[:i] for x, _ in steps.get(b, ())),
                             default=0))
    return Goodput(wall_s=wall, seconds=seconds, segments=tuple(segments),
                   steps_recomputed=redone)


def from_records(*, events: Sequence[Any], metrics: Sequence[Any], diagnoses: Sequence[Any],
                 now: float, ranks: Sequence[Any] = ()) -> Goodput:
    """The ledger from the store's records: state events (EventRecord), rank 0's metric
    points (MetricRecord), the diagnoses (DiagnosisRecord) and rank 0's rows of each attempt
    (RankRecord: a script's collective progress, its first and its latest)."""
    timeline: list[tuple[float, str, int]] = []
    attempt = 0
    for e in events:
        if e.kind != "state" or not e.dst:
            continue
        if e.dst == "PLACING":
            attempt = int((e.data or {}).get("attempt") or attempt + 1)
        timeline.append((e.at.timestamp(), str(e.dst), attempt))
    steps: dict[int, list[tuple[int, float]]] = {}
    for m in metrics:
        steps.setdefault(int(m.attempt), []).append((int(m.step), float(m.time)))
    detections: dict[int, float] = {}
    for d in diagnoses:
        if d.verdict == "STRAGGLER":
            continue
        at = ((d.report or {}).get("details") or {}).get("detected_at")
        when = float(at) if isinstance(at, int | float) else d.created_at.timestamp()
        detections[int(d.attempt)] = min(when, detections.get(int(d.attempt), when))
    progress: dict[int, list[tuple[int, float]]] = {}
    for r in ranks:
        if r.rank == 0 and r.collectives and r.progress_first_at and r.progress_at:
            progress[int(r.attempt)] = [(1, r.progress_first_at.timestamp()),
                                        (int(r.collectives), r.progress_at.timestamp())]
    return goodput(events=timeline, steps=steps, detections=detections, now=now,
                   progress=progress)
