"""Why the plan has its expert- and context-parallel degrees: one note per searched degree
family, comparing the best plan at each degree with the chosen one. Pure module.

For a MoE model the note names the chosen ep and, for every other ep the planner tried (1,
and each divisor of the world), its best plan's step time relative to the chosen one and the
term that makes the difference (exposed communication of one mesh dimension, compute, or the
pipeline bubble), or why no plan with that ep was feasible (the ep does not divide the
experts, the batch does not split, memory). Context parallel alike, when it was searched; when
the request refuses it (a CPU job, dropout) and the sequence is long enough to split, the note
says cp was not considered and why.

Example (8 H100s, a 16-layer d_model 2048 model with 8 experts, 16 sequences of 2048):
  ep=4 (expert parallel) chosen: ep=1 0.108 s/step at best (+8.8%: +0.0136 s exposed
  dp_shard communication); ep=2 0.103 s/step at best (+3.0%: +0.00473 s exposed dp_shard
  communication); ep=8 0.102 s/step at best (+2.9%: +0.00583 s exposed ep communication)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from orchestrator.planner.plan_space import CP_MIN_TOKENS, PlanRequest, cp_degrees, ep_degrees


class _Plan(Protocol):
    @property
    def config(self) -> Any: ...
    @property
    def step_s(self) -> float: ...
    @property
    def compute_s(self) -> float: ...
    @property
    def comm_exposed_s(self) -> float: ...
    @property
    def comm(self) -> tuple[dict[str, Any], ...]: ...


_REASONS = {"experts": "it does not divide the experts", "batch": "the global batch does not "
            "split over its ranks", "memory": "no layout fits in memory", "sequence":
            "the sequence does not split into 2*cp chunks", "workers": "the workers do not run "
            "it"}


def _exposed(p: _Plan) -> dict[str, float]:
    return {row["dimension"]: row["exposed_seconds"] for row in p.comm}


def _why(other: _Plan, best: _Plan) -> str:
    """The term that makes `other` slower than `best` (plans ranked by step time)."""
    terms = {f"exposed {dim} communication": other_s - _exposed(best).get(dim, 0.0)
             for dim, other_s in _exposed(other).items()}
    for dim, best_s in _exposed(best).items():
        terms.setdefault(f"exposed {dim} communication", -best_s)
    terms["compute"] = other.compute_s - best.compute_s
    bubble = lambda p: p.step_s - p.compute_s - p.comm_exposed_s  # noqa: E731
    terms["pipeline bubble"] = bubble(other) - bubble(best)
    name, delta = max(terms.items(), key=lambda kv: kv[1])
    if delta <= 0:
        return "the same step time; the simpler layout wins the tie"
    return f"+{delta:.3g} s {name}"


def _family_note(dim: str, what: str, degrees: list[int], plans: Sequence[_Plan],
                 rejected: dict[int, Counter[str]]) -> str | None:
    if not plans:
        return None
    best = plans[0]
    chosen = getattr(best.config, dim)
    parts = []
    for degree in degrees:
        if degree == chosen:
            continue
        at = next((p for p in plans if getattr(p.config, dim) == degree), None)
        if at is None:
            reasons = rejected.get(degree) or Counter()
            top = reasons.most_common(1)[0][0] if reasons else ""
            parts.append(f"{dim}={degree}: no feasible plan ({_REASONS.get(top, top or 'none')})")
            continue
        slower = at.step_s / best.step_s - 1 if best.step_s else 0.0
        parts.append(f"{dim}={degree} {at.step_s:.3g} s/step at best ({slower:+.1%}: "
                     f"{_why(at, best)})")
    head = f"{dim}={chosen} ({what if chosen > 1 else 'no ' + what}) chosen"
    return f"{head}: " + "; ".join(parts) if parts else head


def degree_notes(req: PlanRequest, world: int, plans: Sequence[_Plan],
                 rejected: dict[tuple[str, int], Counter[str]]) -> list[str]:
    """Notes on the ep and cp choices (see the module doc); `plans` best first, `rejected`:
    the rejection reasons per (dimension, degree)."""
    model = req.model
    out = []
    by = lambda dim: {d: c for (k, d), c in rejected.items() if k == dim}  # noqa: E731
    if model.experts:
        note = _family_note("ep", "expert parallel", [1, *ep_degrees(model, world)], plans,
                            by("ep"))
        if note:
            out.append(note)
    elif cp_degrees(model, world):
        if req.cp_refused is not None:
            out.append(f"cp (context parallel) not considered: {req.cp_refused}; "
                       f"seq_len={model.seq_len} would allow cp up to "
                       f"{max(cp_degrees(model, world))} at {CP_MIN_TOKENS}+ tokens per rank")
        elif note := _family_note("cp", "context parallel", [1, *cp_degrees(model, world)],
                                  plans, by("cp")):
            out.append(note)
    return out
