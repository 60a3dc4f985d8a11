"""A job's condition while a diagnosis is open, and what each rank is doing then. Pure module.

The poller opens a condition when the watchdog reports (one per attempt, the newest report
wins) and clears it when progress resumes past the step it was diagnosed at (a hang; a
straggler keeps stepping, its condition lasts until the attempt ends). Every view of a job
shows it: the API, the jobs list, the job page, `meshyard status`, Prometheus.

>>> from orchestrator.watchdog.report import DiagnosisReport, Verdict
>>> report = DiagnosisReport(verdict=Verdict.NOT_JOINED, culprit_ranks=(1,), confidence=0.9,
...     summary="...", details={"groups": [{"pg": "0", "name": "default_pg", "stuck_seq": 15,
...     "op": "all_reduce", "waiting": [0, 2], "not_joined": [1]}]})
>>> c = JobCondition.from_report(report, diagnosis_id=7, attempt=1, since=1764572181.0, step=14)
>>> c.text()
'hung since 06:56:21 UTC — rank 1 never entered all_reduce #15'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

from orchestrator.watchdog.report import DiagnosisReport, RankReport, Verdict, group_dimension

HUNG = "hung"
STRAGGLING = "straggling"

# The state a culprit rank shows while its diagnosis is open.
_CULPRIT_STATE = {Verdict.NOT_JOINED: "not_joined", Verdict.P2P_MISMATCH: "not_joined",
                  Verdict.RANK_EXITED: "exited", Verdict.STRAGGLER: "straggler",
                  Verdict.COLLECTIVE_MISMATCH: "mismatched", Verdict.COMM_WEDGED: "wedged",
                  Verdict.NON_COLLECTIVE_HANG: "blocked"}


def _ranks(ranks: Sequence[int]) -> str:
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    shown = ", ".join(map(str, rs[:6]))
    return f"ranks {shown}" + (f", … ({len(rs)} ranks)" if len(rs) > 6 else "")


def _group_of(report: DiagnosisReport, ranks: Sequence[int]) -> Mapping[str, Any] | None:
    groups = [g for g in report.details.get("groups") or () if isinstance(g, Mapping)]
    return next((g for g in groups if set(ranks) & set(g.get("not_joined") or ())), None) \
        or next((g for g in groups if g.get("stuck_seq") is not None), None)


def _collective(group: Mapping[str, Any] | None) -> str | None:
    if group is None or group.get("stuck_seq") is None:
        return None
    dim = group_dimension(str(group.get("name") or ""), str(group.get("pg", "")))
    where = f" on {dim}" if dim and dim != "default" else ""
    return f"{group.get('op') or 'collective'} #{group['stuck_seq']}{where}"


def _stuck(report: DiagnosisReport) -> str | None:
    """The collective the culprits' peers wait in: the stuck group the analysis recorded,
    else the op a waiting rank's evidence names."""
    return _collective(_group_of(report, report.culprit_ranks)) or next(
        (p.pending_op for e in report.evidence if e.rank not in report.culprit_ranks
         for p in e.pgs if p.pending_op), None)


def _short_frame(frame: str) -> str:
    """'_block_forever at /x/workers/faults.py:62' -> '_block_forever at faults.py:62'."""
    name, sep, where = frame.rpartition(" at ")
    if not sep:
        return frame[:80]
    return f"{name} at {PurePath(where).name}"


def headline(report: DiagnosisReport) -> str:
    """The condition's clause: who, and what they did or did not do."""
    v, culprits = report.verdict, report.culprit_ranks
    who = _ranks(culprits) if culprits else "no rank"
    if v is Verdict.NOT_JOINED:
        what = _stuck(report)
        return f"{who} never entered {what}" if what else f"{who} never joined the collective"
    if v is Verdict.P2P_MISMATCH:
        return f"{who} never posted the matching send/recv"
    if v is Verdict.RANK_EXITED:
        info = next((e.exit_info for e in report.evidence if e.rank in culprits and e.exit_info),
                    None)
        return f"{who} exited" + (f" ({info[:80]})" if info else "")
    if v is Verdict.COLLECTIVE_MISMATCH and report.mismatches:
        m = report.mismatches[0]
        did = "called a different op" if m.field == "op" else f"passed different {m.field}"
        return f"{_ranks(m.ranks)} {did} at collective #{m.seq}"
    if v is Verdict.COMM_WEDGED:
        what = _stuck(report) or "a collective"
        hw = report.suspect_hardware[0] if report.suspect_hardware else None
        return f"communication wedged in {what}" + (
            f" (suspect {hw.level} {hw.name})" if hw else "")
    if v is Verdict.NON_COLLECTIVE_HANG:
        frames = report.details.get("top_frames") or {}
        top = max(frames, key=lambda f: frames[f]) if isinstance(frames, Mapping) and frames \
            else None
        return "every rank blocked outside collectives" + (
            f" at {_short_frame(str(top))}" if top else "")
    if v is Verdict.STRAGGLER:
        scores = [s for s in report.details.get("straggler_scores") or ()
                  if isinstance(s, Mapping)]
        late = max((float(s.get("median_lateness_s") or 0) for s in scores), default=0.0)
        return f"{who} enters collectives {late * 1000:.0f} ms late" if late else \
            f"{who} is a straggler"
    return "stalled; the evidence names no cause"


@dataclass(frozen=True)
class RankCondition:
    """What a rank is doing while a diagnosis is open: its state in the diagnosis and the
    collective it waits in (or never entered)."""

    state: str
    collective: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "collective": self.collective}


def _pending(e: RankReport) -> str | None:
    return next((p.pending_op or p.missing_op for p in e.pgs
                 if p.pending_op or p.missing_op), None)


def rank_states(report: DiagnosisReport) -> dict[int, RankCondition]:
    """Per rank, from the report's evidence: culprits by the verdict (not_joined, exited,
    straggler, ...), the others as the evidence saw them (waiting, with the collective).
    A straggler report leaves the others alone: they are training."""
    culprits = set(report.culprit_ranks)
    culprit_state = _CULPRIT_STATE.get(report.verdict)
    stuck = _stuck(report) if report.verdict in (Verdict.NOT_JOINED, Verdict.COMM_WEDGED) \
        else None
    out: dict[int, RankCondition] = {}
    for e in report.evidence:
        if e.rank in culprits and culprit_state is not None:
            what = _pending(e) or stuck
            if report.verdict is Verdict.COLLECTIVE_MISMATCH and report.mismatches:
                what = f"collective #{report.mismatches[0].seq}"
            out[e.rank] = RankCondition(culprit_state, what)
        elif report.verdict is not Verdict.STRAGGLER and e.state != "unknown":
            out[e.rank] = RankCondition(e.state, _pending(e))
    return out


@dataclass(frozen=True)
class JobCondition:
    """An open diagnosis as the job carries it. `step` is the job's last step when it was
    made: a hang clears once a newer step is reported."""

    kind: str  # hung | straggling
    verdict: str
    headline: str
    since: float  # unix seconds: when the stall (or straggler) was detected
    culprit_ranks: tuple[int, ...]
    diagnosis_id: int
    attempt: int
    step: int | None = None

    @classmethod
    def from_report(cls, report: DiagnosisReport, *, diagnosis_id: int, attempt: int,
                    since: float, step: int | None) -> JobCondition:
        kind = STRAGGLING if report.verdict is Verdict.STRAGGLER else HUNG
        return cls(kind=kind, verdict=report.verdict.value, headline=headline(report),
                   since=since, culprit_ranks=tuple(report.culprit_ranks),
                   diagnosis_id=diagnosis_id, attempt=attempt, step=step)

    def since_text(self) -> str:
        return datetime.fromtimestamp(self.since, UTC).strftime("%H:%M:%S UTC")

    def text(self) -> str:
        return f"{self.kind} since {self.since_text()} — {self.headline}"

    def cleared_by(self, step: int) -> bool:
        """Progress past the diagnosed step ends a hang (not a straggler: it keeps stepping)."""
        return self.kind == HUNG and step > (self.step if self.step is not None else -1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "verdict": self.verdict, "headline": self.headline,
                "since": datetime.fromtimestamp(self.since, UTC).isoformat(),
                "since_s": self.since, "text": self.text(),
                "culprit_ranks": list(self.culprit_ranks), "diagnosis_id": self.diagnosis_id,
                "attempt": self.attempt, "step": self.step}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobCondition:
        return cls(kind=str(d["kind"]), verdict=str(d["verdict"]),
                   headline=str(d.get("headline", "")), since=float(d["since_s"]),
                   culprit_ranks=tuple(int(r) for r in d.get("culprit_ranks") or ()),
                   diagnosis_id=int(d["diagnosis_id"]), attempt=int(d["attempt"]),
                   step=None if d.get("step") is None else int(d["step"]))
