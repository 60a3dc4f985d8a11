"""The pre-flight check's verdict: which measured link is far slower than its peers. Pure
module (the ranks run it on the gathered timings, so every rank reaches the same verdict; the
controller names the nodes and link class).

Each rank reports the time its receive from rank r-1 took in a p2p ring (a send that starts
late shows up on the receiver) and, per process group it belongs to, the time of an
all-reduce. A p2p pair or a group is slow when its bandwidth is below `min_ratio` x the median
of its kind (p2p pairs; the groups of one mesh dimension). A kind with one sample has nothing
to compare with and passes.

>>> t = [{"rank": 0, "bytes": 1e6, "p2p": {"src": 1, "s": 0.5}, "groups": {}},
...      {"rank": 1, "bytes": 1e6, "p2p": {"src": 0, "s": 0.001}, "groups": {}},
...      {"rank": 2, "bytes": 1e6, "p2p": {"src": 1, "s": 0.001}, "groups": {}}]
>>> [(s.kind, s.ranks) for s in slow_links(t, min_ratio=0.1)]
[('p2p', (1, 0))]
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_EXCESS_S = 0.05


@dataclass(frozen=True)
class SlowLink:
    kind: str  # p2p | all_reduce
    dim: str | None  # the mesh dimension of an all-reduce group
    ranks: tuple[int, ...]  # p2p: (sender, receiver); a group: its members
    gbps: float
    median_gbps: float

    @property
    def ratio(self) -> float:
        return self.gbps / self.median_gbps if self.median_gbps > 0 else 0.0

    @property
    def culprits(self) -> tuple[int, ...]:
        """The ranks to blame: a p2p pair's sender (its send started late), a group's all."""
        return self.ranks[:1] if self.kind == "p2p" else self.ranks

    def describe(self) -> str:
        what = f"p2p {self.ranks[0]}->{self.ranks[1]}" if self.kind == "p2p" else \
            f"all_reduce on {self.dim} group {list(self.ranks)}"
        return (f"{what}: {self.gbps:.3g} GB/s, {self.ratio:.2g}x the median "
                f"{self.median_gbps:.3g} GB/s")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "ranks": list(self.ranks),
                "gbps": self.gbps, "median_gbps": self.median_gbps,
                "ratio": round(self.ratio, 4)}


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / max(seconds, 1e-9) / 1e9


def slow_links(timings: Sequence[Mapping[str, Any]], *, min_ratio: float,
               min_excess_s: float = MIN_EXCESS_S) -> list[SlowLink]:
    """The slow links among every rank's timings (see the module doc). A link is also only
    slow when it took `min_excess_s` longer than the median: on small messages a few
    milliseconds of scheduling noise can halve a bandwidth."""
    pairs: list[tuple[tuple[int, int], float]] = []
    groups: dict[tuple[str, tuple[int, ...]], float] = {}
    for t in timings:
        nbytes = float(t.get("bytes") or 0)
        p = t.get("p2p")
        if isinstance(p, Mapping) and p.get("s") is not None:
            pairs.append(((int(p["src"]), int(t["rank"])), _gbps(nbytes, float(p["s"]))))
        for key, seconds in (t.get("groups") or {}).items():
            dim, _, members = str(key).partition(":")
            ranks = tuple(int(x) for x in members.split(",") if x)
            k = (dim, ranks)
            groups[k] = min(groups.get(k, float("inf")), _gbps(nbytes, float(seconds)))
    nbytes = max((float(t.get("bytes") or 0) for t in timings), default=0.0)

    def slow(bw: float, med: float) -> bool:
        excess = nbytes / max(bw, 1e-12) / 1e9 - nbytes / max(med, 1e-12) / 1e9
        return bw < min_ratio * med and excess >= min_excess_s

    out: list[SlowLink] = []
    if len(pairs) > 1:
        med = statistics.median(bw for _, bw in pairs)
        out += [SlowLink("p2p", None, ranks, bw, med) for ranks, bw in pairs if slow(bw, med)]
    for dim in sorted({d for d, _ in groups}):
        of_dim = [(ranks, bw) for (d, ranks), bw in groups.items() if d == dim]
        if len(of_dim) > 1:
            med = statistics.median(bw for _, bw in of_dim)
            out += [SlowLink("all_reduce", dim, ranks, bw, med) for ranks, bw in of_dim
                    if slow(bw, med)]
    return out


def failure_message(slow: Sequence[SlowLink]) -> str:
    """What a rank raises: the slow links, and the culprit ranks in a form the controller
    reads back (`culprit ranks [1]`)."""
    culprits = sorted({r for s in slow for r in s.culprits})
    return ("pre-flight check failed: " + "; ".join(s.describe() for s in slow[:4])
            + f"; culprit ranks {culprits}")


def culprits_of(message: str) -> list[int]:
    """The culprit ranks a `failure_message` names ([] for any other text)."""
    marker = "culprit ranks ["
    if marker not in message:
        return []
    inside = message.rsplit(marker, 1)[1].split("]", 1)[0]
    return [int(x) for x in inside.split(",") if x.strip().isdigit()]
