"""Bandwidth figures and alpha-beta fits of collective timings. Pure module (stdlib only).

nccl-tests conventions (doc/PERFORMANCE.md there): for a message of M bytes taking t seconds,
algbw = M / t, and busbw = algbw * factor with factor 2(n-1)/n for all-reduce, (n-1)/n for
all-gather and reduce-scatter (M = the full, gathered buffer), 1 for send/recv. busbw is what
each link carries, so it compares across n and primitives.

The cost model's time of one call (cost.py) is t = a_count * alpha + b_count * M / B with
  all_reduce           a_count = 2(n-1), b_count = 2(n-1)/n
  all_gather / r-s     a_count =  (n-1), b_count =  (n-1)/n
  send_recv            a_count = 1,      b_count = 1
so alpha (s) and 1/B (s/byte) are the least-squares solution over every measured row of one
link class. Example: rows (all_reduce, n=2, 8 B, 20 us) and (all_reduce, n=2, 1 MiB, 1.02 ms)
give alpha ~ 10 us and B ~ 1.05 GB/s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PRIMITIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def bus_factor(primitive: str, n: int) -> float:
    if primitive == "all_reduce":
        return 2 * (n - 1) / n
    if primitive in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if primitive == "send_recv":
        return 1.0
    raise ValueError(f"unknown primitive {primitive!r}; use one of {PRIMITIVES}")


def counts(primitive: str, n: int) -> tuple[float, float]:
    """(alpha multiplier, bytes multiplier) of one call in the cost model."""
    if primitive == "send_recv":
        return 1.0, 1.0
    hops = 2 * (n - 1) if primitive == "all_reduce" else n - 1
    return float(hops), bus_factor(primitive, n)


@dataclass(frozen=True)
class Row:
    """One measured size: mean seconds per call over the iterations (slowest rank)."""

    primitive: str
    n: int
    nbytes: int
    seconds: float
    link_class: str = "loopback"
    level: str = "node"

    @property
    def algbw_gbs(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def busbw_gbs(self) -> float:
        return self.algbw_gbs * bus_factor(self.primitive, self.n)

    def as_dict(self) -> dict[str, Any]:
        return {"primitive": self.primitive, "n": self.n, "bytes": self.nbytes,
                "time_us": self.seconds * 1e6, "algbw_gbs": self.algbw_gbs,
                "busbw_gbs": self.busbw_gbs, "link_class": self.link_class,
                "level": self.level}


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float
    gbs: float  # bandwidth B in GB/s (1 / beta)
    rows: int
    rms_rel_error: float

    def predict(self, primitive: str, *, n: int, nbytes: int) -> float:
        a, b = counts(primitive, n)
        return a * self.alpha_s + b * nbytes / (self.gbs * 1e9)

    def as_dict(self) -> dict[str, Any]:
        return {"alpha_us": self.alpha_s * 1e6, "gbs": self.gbs, "rows": self.rows,
                "rms_rel_error": self.rms_rel_error}


def fit_alpha_beta(rows: Iterable[Row]) -> AlphaBeta:
    """Least squares of t = alpha * a + beta * b * M over the rows, weighted by 1/t so small
    and large messages count alike (relative error); alpha and beta kept >= 0."""
    data = [(counts(r.primitive, r.n), r.nbytes, r.seconds) for r in rows if r.seconds > 0]
    if len(data) < 2:
        raise ValueError("need at least two measured sizes to fit alpha and beta")
    xs = [((a / t), (b * m / t)) for (a, b), m, t in data]  # rows of X scaled by 1/t; y = 1
    s11 = sum(x1 * x1 for x1, _ in xs)
    s12 = sum(x1 * x2 for x1, x2 in xs)
    s22 = sum(x2 * x2 for _, x2 in xs)
    y1 = sum(x1 for x1, _ in xs)
    y2 = sum(x2 for _, x2 in xs)
    det = s11 * s22 - s12 * s12
    alpha, beta = ((s22 * y1 - s12 * y2) / det, (s11 * y2 - s12 * y1) / det) if det else (0, 0)
    if beta <= 0:  # latency-only data: no bandwidth term can be fitted
        alpha, beta = y1 / s11, 1e-15
    elif alpha < 0:
        alpha, beta = 0.0, y2 / s22
    fit = AlphaBeta(alpha_s=alpha, gbs=1 / beta / 1e9, rows=len(data), rms_rel_error=0.0)
    errs = [(fit.predict(r.primitive, n=r.n, nbytes=r.nbytes) - r.seconds) / r.seconds
            for r in rows if r.seconds > 0]
    rms = (sum(e * e for e in errs) / len(errs)) ** 0.5
    return AlphaBeta(alpha_s=alpha, gbs=fit.gbs, rows=len(data), rms_rel_error=rms)


def fit_by_class(rows: Iterable[Row]) -> dict[str, AlphaBeta]:
    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.link_class, []).append(r)
    return {k: fit_alpha_beta(v) for k, v in sorted(by.items())}


_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """'8' -> 8, '64KiB' / '64k' -> 65536, '16MiB' -> 16777216."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in _UNITS:
        return int(float(t[:-1]) * _UNITS[t[-1]])
    return int(t)
