"""Block-aligned BestFit candidates.

Pure module. Ranks are row-major (pp, dp_replicate, dp_shard, ep, cp, tp), so the job is a
nest of contiguous rank blocks: a TP group (tp GPUs), a CP ring of TP groups (tp * cp), an EP
group of those (tp * cp * ep), a dp_shard group of EP groups, a pipeline stage (tp * cp * ep *
dp_shard * dp_replicate). The CP and EP blocks come first (smallest): an EP group's
all-to-all and a CP ring's per-layer exchanges are what most needs one NVLink domain after TP.
Plain BestFit packs TP groups; it can leave a
dp_shard group straddling two half-free nodes, or a pipeline stage straddling two leaves, while
whole nodes or leaves were free. So the solver also packs in larger blocks: for a block of b
TP groups it finds the deepest tree level whose domains can hold all the job's blocks (each
block inside one domain there), then BestFits blocks above that level exactly as it BestFits
TP groups (tightest domain that holds them all, else largest first).

Example: tp=1, dp_shard=8, dp_replicate=4 (32 GPUs) on a leaf with nodes of 5, 8, 8, 8, 3 free
GPUs. Plain BestFit takes 5 + 8 + 8 + 8 + 3 and two dp_shard groups straddle nodes; blocks of 8
take the three whole nodes plus one from another leaf, every FSDP group on NVSwitch. The cost
model then picks between the two (`solver.py`).
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.mesh import MeshShape
from orchestrator.placement.domains import Domain, Packing, fill, take_order


def block_sizes(mesh: MeshShape) -> list[int]:
    """Distinct block sizes in TP groups, smallest first (1 = plain BestFit)."""
    out, size = [1], 1
    for dim in ("cp", "ep", "dp_shard", "dp_replicate"):
        size *= getattr(mesh, dim)
        if size not in out and size < mesh.n_tp_groups:
            out.append(size)
    return out


def _depths(root: Domain) -> list[list[Domain]]:
    depths: list[list[Domain]] = [[root]]
    while any(d.children for d in depths[-1]):
        depths.append([c for d in depths[-1] for c in d.children])
    return depths


def _block_caps(depths: list[list[Domain]], home: int, per_block: int) -> dict[int, int]:
    caps = {id(d): d.cap // per_block for d in depths[home]}
    for depth in range(home - 1, -1, -1):
        for d in depths[depth]:
            caps[id(d)] = sum(caps[id(c)] for c in d.children)
    return caps


def candidates(root: Domain, *, units: int, per_block: int, packing: Packing, limit: int,
               tight: bool = True) -> Iterator[tuple[Domain, dict[str, int]]]:
    """Up to `limit` (domain, GPUs per node) choices packing `units` in blocks of `per_block`,
    tightest first."""
    if units % per_block:
        return
    need = units // per_block
    depths = _depths(root)
    for home in range(len(depths) - 1, -1, -1):
        caps = _block_caps(depths, home, per_block)
        if caps[id(root)] >= need:
            break
    else:
        return
    for depth in range(home, -1, -1):
        # BestFit: the tightest domain first; the PACK-like variant: the best linked
        fits = sorted((d for d in depths[depth] if caps[id(d)] >= need),
                      key=lambda d: (caps[id(d)], d.cap, d.free, d.order) if tight
                      else (-d.links_gbs, caps[id(d)], d.free, d.order))
        if fits:
            break
    for dom in fits[:limit]:
        yield dom, _fill_blocks(dom, need, caps=caps, home=set(map(id, depths[home])),
                                per_block=per_block, packing=packing, tight=tight)


def _fill_blocks(dom: Domain, k: int, *, caps: dict[int, int], home: set[int], per_block: int,
                 packing: Packing, tight: bool) -> dict[str, int]:
    if id(dom) in home:
        return fill(dom, k * per_block, packing, tight=tight)
    out: dict[str, int] = {}
    left = sorted(dom.children, key=lambda c: take_order(c, caps[id(c)], tight))
    while k > 0:
        fits = [c for c in left if caps[id(c)] >= k]
        child = min(fits, key=lambda c: (caps[id(c)], c.cap, c.free, c.order)) \
            if fits and tight else left[0]
        take = min(k, caps[id(child)])
        assert take > 0, "block fill beyond the domain's capacity"
        out.update(_fill_blocks(child, take, caps=caps, home=home, per_block=per_block,
                                packing=packing, tight=tight))
        k -= take
        left.remove(child)
    return out
