"""The pre-flight check's pure parts: what each link of the placement is expected to carry,
and the verdict on what it did (the ranks run the verdict on the gathered timings, so every
rank reaches the same one).

Expected figures (`expected_links`, computed by the controller from where the ranks landed):
per process group of a rank, and per p2p pair into it, the link class the cost model gives
it and that class's figures (`LinkFigures`: calibrated by `meshyard calibrate`, else the
defaults). With NCCL the class is the group's bottleneck in the topology (NV18, PIX, SYS,
IB@leaf, NVL-domain, ...; `LinkModel.group_link`); with gloo it is `gloo-loopback` (every
rank on one host) or `gloo-tcp`.

Each rank reports the time its receive from rank r-1 took in a p2p ring (a send that starts
late shows up on the receiver) and, per process group it belongs to, the time of an
all-reduce. A p2p pair or a group is slow when its bandwidth is below `min_ratio` x
- its expected figure (the alpha-beta time of the cost model: `fit.counts`), or
- the median of its kind (p2p pairs; the groups of one mesh dimension; a kind with one sample
  has nothing to compare with),
and it also took `min_excess_s` longer than that reference (timing noise on small messages;
against a gloo figure the margin is larger, `MIN_EXCESS_VS_FIGURE_S`: a loaded host slows
every rank at once).

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

from orchestrator.mesh import DIMS, MeshShape
from orchestrator.placement.links import LinkFigures, LinkModel
from orchestrator.planner.calibration.fit import counts

# How much longer than its reference a test must take to fail. gloo on a shared CPU host
# sees tens of milliseconds of scheduling noise; NCCL timings (synchronised) are in the
# microseconds, so half a millisecond over the expected time is a link that is really slow.
MIN_EXCESS_S = {"gloo": 0.05, "nccl": 0.0005}
# Against its link's figure a gloo test needs a larger margin: every rank of a healthy gang on
# a loaded CPU host is slow together (a 1 MiB loopback send took 59 ms here at load 20, 4 ms
# quiet), which its peers' median absorbs and a fixed figure does not; a broken link (sends
# that start late, TCP falling back to a slow path) costs whole seconds.
MIN_EXCESS_VS_FIGURE_S = {"gloo": 0.5, "nccl": 0.0005}


def min_excess_for(backend: str) -> float:
    return MIN_EXCESS_S.get(backend, MIN_EXCESS_S["gloo"])


def min_excess_vs_figure_for(backend: str) -> float:
    return MIN_EXCESS_VS_FIGURE_S.get(backend, MIN_EXCESS_VS_FIGURE_S["gloo"])


def group_key(dim: str, ranks: Sequence[int]) -> str:
    """The name of a tested group in the timings: "tp:0,1"."""
    return f"{dim}:{','.join(map(str, sorted(ranks)))}"


def p2p_key(src: int, dst: int) -> str:
    return f"p2p:{src},{dst}"


@dataclass(frozen=True)
class ExpectedLink:
    """A tested link's class, its per-direction figures and the nodes it joins."""

    link: str
    gbs: float
    alpha_us: float
    nodes: tuple[str, ...] = ()

    def seconds(self, primitive: str, *, n: int, nbytes: float) -> float:
        a, b = counts(primitive, n)
        return a * self.alpha_us * 1e-6 + b * nbytes / max(self.gbs * 1e9, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {"link": self.link, "gbs": self.gbs, "alpha_us": self.alpha_us,
                "nodes": list(self.nodes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExpectedLink:
        return cls(link=str(d["link"]), gbs=float(d["gbs"]), alpha_us=float(d["alpha_us"]),
                   nodes=tuple(str(n) for n in d.get("nodes") or ()))


@dataclass(frozen=True)
class Site:
    """Where a rank runs: its node (the topology's name), GPU (None on CPU) and host address."""

    node: str
    gpu: int | None
    host: str


def checked_groups(mesh: MeshShape, rank: int) -> dict[str, list[int]]:
    """The groups the check tests on `rank`: the world, then every mesh dimension with more
    than one rank whose group is not the world (workers/host/preflight.py tests the same)."""
    world = mesh.world_size
    out = {group_key("world", range(world)): list(range(world))}
    for dim in DIMS:
        if getattr(mesh, dim) < 2 or getattr(mesh, dim) == world:
            continue
        ranks = mesh.group_ranks(dim, rank)
        out[group_key(dim, ranks)] = ranks
    return out


def _gloo_link(sites: Sequence[Site], figures: LinkFigures) -> ExpectedLink:
    nodes = tuple(sorted({s.node for s in sites}))
    if len({s.host for s in sites}) == 1:
        return ExpectedLink("gloo-loopback", figures.gloo_loopback_gbs,
                            figures.gloo_loopback_alpha_us, nodes)
    return ExpectedLink("gloo-tcp", figures.gloo_net_gbs, figures.gloo_net_alpha_us, nodes)


def _nccl_link(sites: Sequence[Site], model: LinkModel | None) -> ExpectedLink | None:
    if model is None or any(s.gpu is None for s in sites):
        return None
    try:
        link = model.group_link([(s.node, s.gpu) for s in sites if s.gpu is not None])
    except (KeyError, ValueError):  # a node or GPU the topology does not know
        return None
    if link is None:
        return None
    return ExpectedLink(link.kind, link.gbs, link.alpha_s * 1e6,
                        tuple(sorted({s.node for s in sites})))


def expected_links(*, mesh: MeshShape, sites: Mapping[int, Site], backend: str,
                   cluster_links: LinkModel | None = None,
                   figures: LinkFigures | None = None) -> dict[int, dict[str, ExpectedLink]]:
    """Per rank, the expected figure of each group it tests and of the p2p pair into it.

    >>> sites = {0: Site("n0", None, "10.0.0.1"), 1: Site("n1", None, "10.0.0.2")}
    >>> got = expected_links(mesh=MeshShape(dp_shard=2), sites=sites, backend="gloo")
    >>> sorted(got[1]), got[1]["p2p:0,1"].link, got[1]["p2p:0,1"].nodes
    (['p2p:0,1', 'world:0,1'], 'gloo-tcp', ('n0', 'n1'))
    """
    f = cluster_links.figures if cluster_links is not None else (figures or LinkFigures())
    world = mesh.world_size

    def link_of(ranks: Sequence[int]) -> ExpectedLink | None:
        if any(r not in sites for r in ranks):
            return None
        members = [sites[r] for r in ranks]
        return _nccl_link(members, cluster_links) if backend == "nccl" else \
            _gloo_link(members, f)

    cache: dict[tuple[int, ...], ExpectedLink | None] = {}
    out: dict[int, dict[str, ExpectedLink]] = {}
    for rank in range(world):
        mine: dict[str, ExpectedLink] = {}
        src = (rank - 1) % world
        wanted = {**checked_groups(mesh, rank), p2p_key(src, rank): [src, rank]}
        for key, ranks in wanted.items():
            members = tuple(ranks)
            if members not in cache:
                cache[members] = link_of(members)
            link = cache[members]
            if link is not None:
                mine[key] = link
        out[rank] = mine
    return out


@dataclass(frozen=True)
class SlowLink:
    kind: str  # p2p | all_reduce
    dim: str | None  # the mesh dimension of an all-reduce group
    ranks: tuple[int, ...]  # p2p: (sender, receiver); a group: its members
    gbps: float
    median_gbps: float | None = None  # of its kind (None: the only one of its kind)
    expected: ExpectedLink | None = None
    expected_gbps: float | None = None  # what its link should give for this test

    @property
    def ratio(self) -> float:
        ref = self.expected_gbps if self.expected_gbps else self.median_gbps
        return self.gbps / ref if ref else 0.0

    @property
    def culprits(self) -> tuple[int, ...]:
        """The ranks to blame: a p2p pair's sender (its send started late), a group's all."""
        return self.ranks[:1] if self.kind == "p2p" else self.ranks

    def describe(self) -> str:
        what = f"p2p {self.ranks[0]}->{self.ranks[1]}" if self.kind == "p2p" else \
            f"all_reduce on {self.dim} group {list(self.ranks)}"
        if self.expected is not None:
            what += f" over {self.expected.link}"
            if self.expected.nodes:
                what += f" ({', '.join(self.expected.nodes)})"
        out = f"{what}: {self.gbps:.3g} GB/s"
        if self.expected_gbps:
            out += f", expected {self.expected_gbps:.3g} GB/s ({self.ratio:.2g}x)"
        if self.median_gbps:
            out += f", median of its peers {self.median_gbps:.3g} GB/s"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "ranks": list(self.ranks),
                "gbps": self.gbps, "median_gbps": self.median_gbps,
                "expected_gbps": self.expected_gbps,
                "link": self.expected.link if self.expected else None,
                "nodes": list(self.expected.nodes) if self.expected else [],
                "ratio": round(self.ratio, 4)}


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / max(seconds, 1e-9) / 1e9


@dataclass(frozen=True)
class _Test:
    kind: str
    dim: str | None
    ranks: tuple[int, ...]
    gbps: float
    expected: ExpectedLink | None


def _tests(timings: Sequence[Mapping[str, Any]]) -> tuple[list[_Test], float]:
    """Every tested link once (a group's slowest member's time), with its figure."""
    tests: dict[tuple[str, tuple[int, ...]], _Test] = {}
    for t in timings:
        nbytes = float(t.get("bytes") or 0)
        known = {k: ExpectedLink.from_dict(v) for k, v in (t.get("expected") or {}).items()}
        p = t.get("p2p")
        if isinstance(p, Mapping) and p.get("s") is not None:
            pair = (int(p["src"]), int(t["rank"]))
            tests[("p2p", pair)] = _Test("p2p", None, pair, _gbps(nbytes, float(p["s"])),
                                        known.get(p2p_key(*pair)))
        for key, seconds in (t.get("groups") or {}).items():
            dim, _, members = str(key).partition(":")
            ranks = tuple(int(x) for x in members.split(",") if x)
            bw = _gbps(nbytes, float(seconds))
            prev = tests.get((dim, ranks))
            if prev is None or bw < prev.gbps:
                tests[(dim, ranks)] = _Test("all_reduce", dim, ranks, bw,
                                            known.get(key) or (prev.expected if prev else None))
    nbytes = max((float(t.get("bytes") or 0) for t in timings), default=0.0)
    return list(tests.values()), nbytes


def slow_links(timings: Sequence[Mapping[str, Any]], *, min_ratio: float,
               min_excess_s: float = MIN_EXCESS_S["gloo"],
               min_excess_vs_figure_s: float | None = None) -> list[SlowLink]:
    """The slow links among every rank's timings (see the module doc), in test order.
    `min_excess_vs_figure_s` is the margin against a link's figure (default `min_excess_s`)."""
    tests, nbytes = _tests(timings)
    vs_figure = min_excess_s if min_excess_vs_figure_s is None else min_excess_vs_figure_s

    def seconds(bw: float) -> float:
        return nbytes / max(bw, 1e-12) / 1e9

    def slow(bw: float, ref: float | None, excess: float = min_excess_s) -> bool:
        if not ref:
            return False
        return bw < min_ratio * ref and seconds(bw) - seconds(ref) >= excess

    medians: dict[str | None, float] = {}
    for kind in sorted({t.dim for t in tests}, key=str):
        of_kind = [t.gbps for t in tests if t.dim == kind]
        if len(of_kind) > 1:
            medians[kind] = statistics.median(of_kind)
    out: list[SlowLink] = []
    for t in tests:
        exp_gbps = None
        if t.expected is not None:
            n = len(t.ranks)
            prim = "send_recv" if t.kind == "p2p" else "all_reduce"
            exp_gbps = _gbps(nbytes, t.expected.seconds(prim, n=n, nbytes=nbytes))
        med = medians.get(t.dim)
        if slow(t.gbps, exp_gbps, vs_figure) or slow(t.gbps, med):
            out.append(SlowLink(t.kind, t.dim, t.ranks, t.gbps, median_gbps=med,
                                expected=t.expected, expected_gbps=exp_gbps))
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
