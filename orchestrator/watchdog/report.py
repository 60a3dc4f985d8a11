"""DiagnosisReport: the value objects a hang diagnosis produces (ARCHITECTURE.md contract).

Pure module (stdlib only). `to_dict()` gives plain JSON types, `from_dict()` reverses it, and
`to_markdown()` renders the report whose first line is the sentence a person acts on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class Verdict(StrEnum):
    NOT_JOINED = "NOT_JOINED"
    RANK_EXITED = "RANK_EXITED"
    COLLECTIVE_MISMATCH = "COLLECTIVE_MISMATCH"
    P2P_MISMATCH = "P2P_MISMATCH"
    COMM_WEDGED = "COMM_WEDGED"
    NON_COLLECTIVE_HANG = "NON_COLLECTIVE_HANG"
    STRAGGLER = "STRAGGLER"
    UNKNOWN = "UNKNOWN"


def _frozen_map(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class RankLocation:
    """Where a rank runs. `labels` are topology levels innermost first, e.g.
    {"nvlink_domain": "n0-nv0", "leaf": "l0", "spine": "s0"}; `mesh` holds mesh coordinates
    ({"pp": 0, "dp": 1, "tp": 0})."""

    node: str | None = None
    gpu: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    mesh: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen_map(self.labels))
        object.__setattr__(self, "mesh", _frozen_map(self.mesh))

    def describe(self) -> str:
        """'node-b GPU 1, tp 1' — the words used in summaries."""
        parts = []
        if self.node is not None:
            parts.append(self.node + (f" GPU {self.gpu}" if self.gpu is not None else ""))
        elif self.gpu is not None:
            parts.append(f"GPU {self.gpu}")
        parts += [f"{k} {v}" for k, v in self.mesh.items()]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpu": self.gpu, "labels": dict(self.labels),
                "mesh": dict(self.mesh)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RankLocation:
        return RankLocation(node=d.get("node"), gpu=d.get("gpu"), labels=d.get("labels") or {},
                            mesh=d.get("mesh") or {})


def group_dimension(desc: str | None, pg: str) -> str | None:
    """A process group's mesh dimension from its description, the name that is the same on
    every rank (numeric group ids differ between the ranks of one dimension).

    >>> group_dimension("mesh_dp_shard", "3"), group_dimension("default_pg", "0")
    ('dp_shard', 'default')
    """
    if desc and desc.startswith("mesh_"):
        return desc.removeprefix("mesh_")
    if desc == "default_pg" or (not desc and pg == "0"):
        return "default"
    return desc or None


@dataclass(frozen=True)
class PgProgress:
    """One process group as seen by one rank: last enqueued / completed collective seq.
    `name` is its mesh dimension (tp, pp, dp_shard, dp_replicate, default) when known;
    `missing_op` the collective its peers wait in that this rank never entered."""

    pg: str
    last_enqueued: int | None = None
    last_completed: int | None = None
    pending_op: str | None = None  # e.g. "all_reduce #7" when enqueued and not completed
    name: str | None = None
    missing_op: str | None = None

    @property
    def pending(self) -> bool:
        """Something was enqueued on this group and is not completed."""
        enq = self.last_enqueued or 0
        return enq > 0 and enq > (self.last_completed or 0)

    def to_dict(self) -> dict[str, Any]:
        return {"pg": self.pg, "name": self.name, "last_enqueued": self.last_enqueued,
                "last_completed": self.last_completed, "pending_op": self.pending_op,
                "missing_op": self.missing_op, "pending": self.pending}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PgProgress:
        return PgProgress(pg=str(d["pg"]), last_enqueued=d.get("last_enqueued"),
                          last_completed=d.get("last_completed"), pending_op=d.get("pending_op"),
                          name=d.get("name"), missing_op=d.get("missing_op"))


@dataclass(frozen=True)
class RankReport:
    """Per-rank evidence as reported. `state`: waiting | not_joined | exited | idle | unknown."""

    rank: int
    state: str
    step: int | None = None
    pgs: tuple[PgProgress, ...] = ()
    top_of_stack: str | None = None
    nccl_errors: tuple[str, ...] = ()
    exit_info: str | None = None
    location: RankLocation | None = None
    has_trace: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "state": self.state, "step": self.step,
            "pgs": [p.to_dict() for p in self.pgs], "top_of_stack": self.top_of_stack,
            "nccl_errors": list(self.nccl_errors), "exit_info": self.exit_info,
            "location": self.location.to_dict() if self.location else None,
            "has_trace": self.has_trace,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RankReport:
        loc = d.get("location")
        return RankReport(
            rank=int(d["rank"]), state=str(d.get("state", "unknown")), step=d.get("step"),
            pgs=tuple(PgProgress.from_dict(p) for p in d.get("pgs") or ()),
            top_of_stack=d.get("top_of_stack"), nccl_errors=tuple(d.get("nccl_errors") or ()),
            exit_info=d.get("exit_info"),
            location=RankLocation.from_dict(loc) if loc else None,
            has_trace=bool(d.get("has_trace", False)),
        )


@dataclass(frozen=True)
class Mismatch:
    """Ranks that ran something different at the same (pg, seq): `field` is op | sizes | dtypes
    | p2p; `expected` is the majority's value, `actual` maps each deviating rank to its value."""

    pg: str
    seq: int | None
    field: str
    expected: str
    actual: Mapping[int, str]
    agreeing: tuple[int, ...] = ()  # ranks that ran `expected`

    def __post_init__(self) -> None:
        object.__setattr__(self, "actual", MappingProxyType(dict(self.actual)))
        object.__setattr__(self, "agreeing", tuple(sorted(self.agreeing)))

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.actual))

    def describe(self) -> str:
        got = "; ".join(f"rank {r}: {v}" for r, v in sorted(self.actual.items()))
        where = f"#{self.seq} " if self.seq is not None else ""
        return f"{self.field} differs at {where}on pg {self.pg}: expected {self.expected}; {got}"

    def to_dict(self) -> dict[str, Any]:
        return {"pg": self.pg, "seq": self.seq, "field": self.field, "expected": self.expected,
                "actual": {str(r): v for r, v in self.actual.items()}, "ranks": list(self.ranks),
                "agreeing": list(self.agreeing)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Mismatch:
        return Mismatch(pg=str(d["pg"]), seq=d.get("seq"), field=str(d["field"]),
                        expected=str(d["expected"]),
                        actual={int(r): str(v) for r, v in (d.get("actual") or {}).items()},
                        agreeing=tuple(int(r) for r in d.get("agreeing") or ()))


@dataclass(frozen=True)
class SuspectHardware:
    """A piece of hardware the stuck groups share: level is gpu | node | nvlink_domain | a
    topology label key (leaf, spine, ...). `driver_errors`: what the GPU's driver reports
    that takes it out of service by itself (uncorrectable ECC, fatal Xids; gpu_errors.py)."""

    level: str
    name: str
    ranks: tuple[int, ...]
    reason: str
    driver_errors: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"level": self.level, "name": self.name, "ranks": list(self.ranks),
               "reason": self.reason}
        if self.driver_errors:
            out["driver_errors"] = list(self.driver_errors)
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SuspectHardware:
        return SuspectHardware(level=str(d["level"]), name=str(d["name"]),
                               ranks=tuple(int(r) for r in d.get("ranks") or ()),
                               reason=str(d.get("reason", "")),
                               driver_errors=tuple(str(x) for x in
                                                   d.get("driver_errors") or ()))


@dataclass(frozen=True)
class DiagnosisReport:
    verdict: Verdict
    culprit_ranks: tuple[int, ...]
    confidence: float
    summary: str
    evidence: tuple[RankReport, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    suspect_hardware: tuple[SuspectHardware, ...] = ()
    recommendations: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))
        object.__setattr__(self, "culprit_ranks", tuple(sorted(set(self.culprit_ranks))))
        object.__setattr__(self, "confidence", max(0.0, min(1.0, float(self.confidence))))
        object.__setattr__(self, "details", _frozen_map(self.details))

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "culprit_ranks": list(self.culprit_ranks),
            "confidence": round(self.confidence, 3),
            "summary": self.summary,
            "evidence": [e.to_dict() for e in self.evidence],
            "mismatches": [m.to_dict() for m in self.mismatches],
            "suspect_hardware": [s.to_dict() for s in self.suspect_hardware],
            "recommendations": list(self.recommendations),
            "artifacts": list(self.artifacts),
            "details": dict(self.details),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> DiagnosisReport:
        return DiagnosisReport(
            verdict=Verdict(d["verdict"]),
            culprit_ranks=tuple(int(r) for r in d.get("culprit_ranks") or ()),
            confidence=float(d.get("confidence", 0.0)),
            summary=str(d.get("summary", "")),
            evidence=tuple(RankReport.from_dict(e) for e in d.get("evidence") or ()),
            mismatches=tuple(Mismatch.from_dict(m) for m in d.get("mismatches") or ()),
            suspect_hardware=tuple(
                SuspectHardware.from_dict(s) for s in d.get("suspect_hardware") or ()),
            recommendations=tuple(d.get("recommendations") or ()),
            artifacts=tuple(d.get("artifacts") or ()),
            details=d.get("details") or {},
        )

    def to_markdown(self) -> str:
        """First line is the summary (the sentence a person acts on), then the detail."""
        culprits = ", ".join(str(r) for r in self.culprit_ranks) or "none"
        lines = [self.summary or f"{self.verdict.value}: no summary.", "",
                 f"**Verdict:** {self.verdict.value} · **culprit ranks:** {culprits} · "
                 f"**confidence:** {self.confidence:.2f}", ""]
        if self.mismatches:
            lines += ["## Collective mismatches", ""]
            lines += [f"- {m.describe()}" for m in self.mismatches] + [""]
        if self.suspect_hardware:
            lines += ["## Suspect hardware", ""]
            lines += [f"- {s.level} `{s.name}` (ranks {', '.join(map(str, s.ranks))}): "
                      f"{s.reason}" for s in self.suspect_hardware] + [""]
        if self.recommendations:
            lines += ["## Recommendations", ""]
            lines += [f"{i}. {r}" for i, r in enumerate(self.recommendations, 1)] + [""]
        if self.evidence:
            lines += _evidence_table(self.evidence)
        if self.artifacts:
            lines += ["## Artifacts", ""] + [f"- `{a}`" for a in self.artifacts] + [""]
        return "\n".join(lines).rstrip() + "\n"


def _evidence_table(evidence: tuple[RankReport, ...]) -> list[str]:
    lines = ["## Per-rank evidence", "",
             "| rank | state | step | where | process groups (enq/done) | top of stack | errors |",
             "|---|---|---|---|---|---|---|"]
    for e in evidence:
        pgs = " ".join(f"{p.name or p.pg}:{_dash(p.last_enqueued)}/{_dash(p.last_completed)}"
                       for p in e.pgs)
        where = e.location.describe() if e.location else ""
        top = (e.top_of_stack or "").replace("|", "\\|")
        errs = "; ".join(e.nccl_errors[:2]).replace("|", "\\|")
        if e.exit_info:
            errs = (f"exit: {e.exit_info}; " + errs).rstrip("; ")
        lines.append(f"| {e.rank} | {e.state} | {_dash(e.step)} | {where} | {pgs} | {top} "
                     f"| {errs} |")
    return [*lines, ""]


def _dash(v: object) -> str:
    return "-" if v is None else str(v)
