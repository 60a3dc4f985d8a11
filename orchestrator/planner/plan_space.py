"""The planner's search space: the request, the hardware figures, the configurations
(tp, pp, dp_shard, dp_replicate, ep, cp, ZeRO stage, microbatches, virtual stages, activation
checkpointing) of a world of GPUs, and the rejections that name why one cannot run. Pure
module.

Expert and context parallel families are the layouts the workers run: ep (a MoE model's
experts split over ep ranks, ep dividing the expert count and the world) alone or with
dp_shard, and cp (each sequence split over cp ranks, ring attention) alone or with dp_shard,
cp unless the request refuses it (`cp_refused`: a job on CPU, where torch has no attention
strategy for it, or with dropout) and only where each
rank keeps at least `CP_MIN_TOKENS` tokens of a sequence (below that the ring's exchanges
cost more than the activations they save).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.bounds.limits import divisors
from orchestrator.mesh import Degrees
from orchestrator.planner.memory import ModelShape

_MAX_MICROBATCH_OPTIONS = 5
CP_MIN_TOKENS = 1024  # tokens of a sequence per cp rank for cp to be considered


@dataclass(frozen=True)
class Hardware:
    """Per-GPU figures. Defaults: H100 SXM, dense bf16 989 TFLOP/s at 40% model FLOPs use."""

    memory_gb: float = 80.0
    peak_tflops: float = 989.0
    efficiency: float = 0.4
    reserve: float = 0.1  # allocator fragmentation, CUDA context, NCCL buffers
    precision: str = "bf16-mixed"

    @property
    def usable_bytes(self) -> float:
        return self.memory_gb * 1e9 * (1 - self.reserve)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PlanRequest:
    model: ModelShape
    global_batch: int  # sequences per optimizer step
    gpus: int | None = None  # None: every free GPU
    hardware: Hardware = field(default_factory=Hardware)
    even_stages: bool = False  # pp must divide n_layers (the workers' pipeline needs it)
    worker_layouts: bool = False  # only layouts meshyard's workers run (see _worker_issue)
    schedule: str = "1f1b"
    top_k: int = 10
    solve_top: int = 0  # run the full solver on this many of the best plans
    # Why context parallel is not considered for this job (None: it is; the GPUs run it)
    cp_refused: str | None = None

    @property
    def context_parallel(self) -> bool:
        return self.cp_refused is None


@dataclass(frozen=True)
class Candidate(Degrees):
    tp: int
    pp: int
    dp_shard: int
    dp_replicate: int
    zero_stage: int
    microbatches: int
    activation_checkpointing: bool
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B when > 1)
    # the first and last chunk hold one layer fewer (embedding / head in its place)
    ends_as_layers: bool = False
    ep: int = 1  # expert parallel (MoE experts split over ep ranks reading distinct data)
    cp: int = 1  # context parallel (each sequence split over cp ranks)

    @property
    def schedule(self) -> str:
        return "interleaved_1f1b" if self.virtual_stages > 1 else "1f1b"


    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def label(self) -> str:
        ac = " ac" if self.activation_checkpointing else ""
        v = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        ends = " ends" if self.ends_as_layers else ""
        extra = (f" ep{self.ep}" if self.ep > 1 else "") + (f" cp{self.cp}" if self.cp > 1 else "")
        return (f"tp{self.tp} pp{self.pp} dps{self.dp_shard} dpr{self.dp_replicate}{extra} "
                f"z{self.zero_stage} m{self.microbatches}{v}{ends}{ac}")


@dataclass(frozen=True)
class Rejection:
    config: Candidate
    reason: str  # memory | tp_domain | heads | layers | batch | workers | experts | sequence
    message: str
    need_bytes: float | None = None  # memory: what the configuration needs per GPU

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), "label": self.config.label(),
                "reason": self.reason, "message": self.message,
                "need_gb": None if self.need_bytes is None else self.need_bytes / 1e9}


def _pow2_divisors(n: int) -> list[int]:
    return [d for d in divisors(n) if d & (d - 1) == 0]


def _dp_splits(dp: int) -> list[tuple[int, int]]:
    """(dp_shard, dp_replicate): pure FSDP, pure DDP, and HSDP with power-of-two shards."""
    shards = sorted({1, dp, *(d for d in _pow2_divisors(dp) if d < dp)})
    return [(s, dp // s) for s in shards]


VIRTUAL_STAGES = (1, 2, 4, 8)


def virtual_options(model: ModelShape, pp: int) -> list[tuple[int, bool]]:
    """(chunks per pipeline rank, ends_as_layers) for interleaved 1F1B: v in 1, 2, 4, 8 while
    every chunk keeps a block, and, Llama 3's layout, the embedding and the head taking one
    layer's place each when that evens the chunks or lets pp * v reach n_layers + 2 (the
    first and last chunk then hold one layer fewer)."""
    if pp == 1:
        return [(1, False)]
    out = []
    for v in VIRTUAL_STAGES:
        chunks = v * pp
        if chunks <= model.n_layers:
            out.append((v, False))
        if (model.n_layers + 2) % chunks == 0 and model.n_layers % chunks:
            out.append((v, True))
    return out


def skipped_virtual(model: ModelShape, pp: int) -> str | None:
    """Why interleaving options were left out for this pp (a note for the plan)."""
    ks = [v for v in VIRTUAL_STAGES[1:] if v * pp > model.n_layers + 2]
    if pp == 1 or not ks:
        return None
    return (f"pp={pp}: interleaving with v={'/'.join(map(str, ks))} chunks per rank not "
            f"considered: {ks[0] * pp} or more chunks exceed the {model.n_layers} layers plus "
            "the embedding and the head")


def _microbatch_options(local_batch: int, pp: int) -> list[int]:
    opts = [m for m in divisors(local_batch) if m >= pp or pp == 1]
    if len(opts) <= _MAX_MICROBATCH_OPTIONS:
        return opts
    # few, spread from the least to the most microbatches (the most: the smallest bubble)
    step = (len(opts) - 1) / (_MAX_MICROBATCH_OPTIONS - 1)
    return sorted({opts[round(i * step)] for i in range(_MAX_MICROBATCH_OPTIONS)})


def candidates(model: ModelShape, *, world: int, global_batch: int, max_tp: int,
               context_parallel: bool = False) -> Iterator[Candidate | Rejection]:
    """Every configuration of `world` GPUs, or the reason a whole family is impossible
    (expert-parallel families for a MoE model, context-parallel ones when allowed)."""
    for tp in divisors(world):
        if tp > 1 and tp & (tp - 1):
            continue  # TP degrees are powers of two in practice (heads, hidden sizes)
        base = Candidate(tp, 1, 1, world // tp, 0, 1, False)
        if model.n_heads % tp or model.ffn % tp:
            yield Rejection(base, "heads", f"tp={tp} does not divide n_heads={model.n_heads} "
                            f"and the MLP size {model.ffn}")
            continue
        if tp > max_tp:
            yield Rejection(base, "tp_domain", f"tp={tp} crosses NVLink domains (largest "
                            f"domain on the free GPUs: {max_tp})")
            continue
        for pp in divisors(world // tp):
            if pp > model.n_layers:
                break
            dp = world // tp // pp
            yield from _family(model, tp=tp, pp=pp, dp=dp, global_batch=global_batch)
    if model.experts:
        yield from _ep_families(model, world=world, global_batch=global_batch)
    if context_parallel and not model.experts:
        yield from _cp_families(model, world=world, global_batch=global_batch)


def ep_degrees(model: ModelShape, world: int) -> list[int]:
    """Expert-parallel degrees > 1 the planner tries: divisors of the world."""
    return [ep for ep in divisors(world) if ep > 1] if model.experts else []


def cp_degrees(model: ModelShape, world: int) -> list[int]:
    """Context-parallel degrees > 1 the planner tries: powers of two dividing the world that
    leave every cp rank `CP_MIN_TOKENS` tokens or more."""
    return [cp for cp in _pow2_divisors(world)
            if cp > 1 and model.seq_len // cp >= CP_MIN_TOKENS]


def _sharded_families(model: ModelShape, *, world: int, global_batch: int, dim: str,
                      degree: int, data_shards: int) -> Iterator[Candidate | Rejection]:
    """ep or cp (`dim`) = `degree` with dp_shard = world / degree: FSDP over both (ZeRO-2/3
    when dp_shard > 1; with dp_shard = 1 the workers shard over the ep / cp ranks anyway)."""
    dp_shard = world // degree
    base = Candidate(1, 1, dp_shard, 1, 0, 1, False, **{dim: degree})
    if global_batch % data_shards:
        yield Rejection(base, "batch", f"global batch {global_batch} is not divisible by the "
                        f"{data_shards} ranks reading distinct data ({dim}={degree})")
        return
    local = global_batch // data_shards
    for zero in ((2, 3) if dp_shard > 1 else (0,)):
        for m in _microbatch_options(local, 1):
            for ac in (False, True):
                yield Candidate(1, 1, dp_shard, 1, zero, m, ac, **{dim: degree})


def _ep_families(model: ModelShape, *, world: int, global_batch: int
                 ) -> Iterator[Candidate | Rejection]:
    for ep in ep_degrees(model, world):
        if model.experts % ep:
            yield Rejection(Candidate(1, 1, world // ep, 1, 0, 1, False, ep=ep), "experts",
                            f"ep={ep} does not divide the {model.experts} experts")
            continue
        yield from _sharded_families(model, world=world, global_batch=global_batch, dim="ep",
                                     degree=ep, data_shards=world)


def _cp_families(model: ModelShape, *, world: int, global_batch: int
                 ) -> Iterator[Candidate | Rejection]:
    for cp in cp_degrees(model, world):
        if model.seq_len % (2 * cp):
            yield Rejection(Candidate(1, 1, world // cp, 1, 0, 1, False, cp=cp), "sequence",
                            f"cp={cp} splits each sequence into 2*cp={2 * cp} chunks; "
                            f"seq_len={model.seq_len} is not a multiple of it")
            continue
        yield from _sharded_families(model, world=world, global_batch=global_batch, dim="cp",
                                     degree=cp, data_shards=world // cp)


def _family(model: ModelShape, *, tp: int, pp: int, dp: int,
            global_batch: int) -> Iterator[Candidate | Rejection]:
    if global_batch % dp:
        yield Rejection(Candidate(tp, pp, dp, 1, 0, 1, False), "batch",
                        f"global batch {global_batch} is not divisible by dp={dp}")
        return
    local = global_batch // dp
    for dp_shard, dp_rep in _dp_splits(dp):
        for zero in ((1, 2, 3) if dp_shard > 1 else (0,)):
            for m in _microbatch_options(local, pp):
                for v, ends in virtual_options(model, pp):
                    for ac in (False, True):
                        yield Candidate(tp, pp, dp_shard, dp_rep, zero, m, ac, v, ends)
