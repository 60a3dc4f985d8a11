"""Layout truth: for every layout the spec accepts on a tiny model (each degree 1 or 2, every
ZeRO stage, plus sequence parallel, activation checkpointing and interleaved stages), each
rank's parameters are sharded exactly as its degrees say, right after the loop parallelized
them (layout_probe.py; nothing trains, so what parity tests cannot see shows here: a TP rank
that computes the whole layer still gives the reference's loss).

What each degree means, worked out here from the mesh contract and not from the code that
applies it:

* tp: Q/K/V and the MLP's up projection are Shard(0) over the rank's TP group, the attention
  output and the MLP's down projection Shard(1); everything else is replicated over it.
* pp: the rank holds exactly its stages' layers (stage s of pp*v holds n_layers/(pp*v)
  consecutive ones, pp rank k holds stages k, k + pp, ...), the embedding with stage 0, the
  final norm and the head with the last.
* FSDP (ZeRO-2/3): Shard(0) over the dp_shard group, Replicate over dp_replicate (HSDP).
* replicated data parallelism (ZeRO-0/1): over the whole data-parallel group (dp_replicate x
  dp_shard): DDP's process group, or Replicate placements where the parameters are DTensors
  (with TP or pipeline stages).
* ep: a rank keeps experts/ep experts; the other parameters are Shard(0) over dp_shard x ep,
  the experts over dp_shard.

The local shape of every parameter is its global shape divided by the sizes of the groups
sharding each dimension.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from orchestrator.mesh import MeshShape
from orchestrator.spec import JobSpec, SpecValidationError, parse_spec
from tests.integration.workers.launch_helpers import REPO, _env

MODEL = {"kind": "gpt", "n_layers": 4, "n_heads": 4, "d_model": 16, "vocab_size": 32,
         "seq_len": 8}
MOE = {"experts": 4, "top_k": 2}
TP_SHARD_DIM = {"attn.wq": 0, "attn.wk": 0, "attn.wv": 0, "mlp.up": 0, "attn.wo": 1,
                "mlp.down": 1}
DEGREES = ("pp", "dp_replicate", "dp_shard", "ep", "tp")


def _spec(name: str, parallelism: dict[str, Any]) -> dict[str, Any] | None:
    model = {**MODEL, **({"moe": MOE} if parallelism.get("ep", 1) > 1 else {})}
    if parallelism.get("pp", 1) > 1:
        parallelism = {"pp_microbatches": 2, **parallelism}
    doc = {"name": name, "parallelism": parallelism, "model": model,
           "resources": {"device": "cpu"}, "training": {"micro_batch_size": 4},
           "checkpoint": {"enabled": False}, "preflight": {"enabled": False}}
    try:
        parse_spec(doc)
    except SpecValidationError:
        return None
    return doc


def _variants(par: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each accepted ZeRO stage; with the default stage, sequence parallel (tp), activation
    checkpointing, and interleaved stages (pp)."""
    label = "-".join(f"{d}{par[d]}" for d in DEGREES if par[d] > 1)
    for zero in (0, 1, 2, 3):
        yield f"{label}-z{zero}", {**par, "zero_stage": zero}
    yield f"{label}-ac", {**par, "activation_checkpointing": True}
    if par["tp"] > 1:
        yield f"{label}-sp", {**par, "sequence_parallel": True}
    if par["pp"] > 1:
        yield f"{label}-v2", {**par, "pp_schedule": "interleaved_1f1b",
                              "pp_virtual_stages": 2}


def accepted_layouts(world: int) -> dict[str, dict[str, Any]]:
    out = {}
    for values in product((1, 2), repeat=len(DEGREES)):
        par = dict(zip(DEGREES, values, strict=True))
        if MeshShape.from_degrees(par).world_size != world:
            continue
        for name, variant in _variants(par):
            doc = _spec(name, variant)
            if doc is not None:
                out[name] = doc
    return out


# --- what the degrees say ------------------------------------------------------------------

def _group(mesh: MeshShape, rank: int, dims: tuple[str, ...]) -> tuple[int, ...]:
    """Ranks that differ from `rank` only along `dims`."""
    c = mesh.coords(rank)
    return tuple(sorted(r for r in range(mesh.world_size)
                        if all(v == c[d] for d, v in mesh.coords(r).items() if d not in dims)))


def _pp_names(spec: JobSpec, mesh: MeshShape, rank: int, names: list[str]) -> set[str]:
    """The full model's parameter names that `rank`'s pipeline stages hold."""
    par, n_layers = spec.parallelism, len({n.split(".")[1] for n in names
                                           if n.startswith("layers.")})
    n_stages = mesh.pp * par.pp_virtual_stages
    stages = {mesh.coords(rank)["pp"] + k * mesh.pp for k in range(par.pp_virtual_stages)}
    per = n_layers // n_stages
    layers = {str(i) for s in stages for i in range(s * per, (s + 1) * per)}
    return {n for n in names
            if (n.startswith("layers.") and n.split(".")[1] in layers)
            or (n.startswith("embed.") and 0 in stages)
            or (n.startswith(("norm.", "lm_head.")) and n_stages - 1 in stages)}


Sharding = set[tuple[tuple[int, ...], str]]  # (group of ranks, 'S<dim>' | 'R')


def expected_sharding(spec: JobSpec, mesh: MeshShape, rank: int,
                      name: str) -> tuple[Sharding, Sharding]:
    """What a parameter must carry, and what it may carry besides (a parameter replicated
    over TP may or may not be a DTensor over the TP group)."""
    want: Sharding = set()
    optional: Sharding = set()
    module = ".".join(name.split(".")[2:4])
    expert = ".experts." in name
    tp_group = _group(mesh, rank, ("tp",))
    if mesh.tp > 1 and module in TP_SHARD_DIM:
        want.add((tp_group, f"S{TP_SHARD_DIM[module]}"))
    elif mesh.tp > 1:
        optional.add((tp_group, "R"))
    dp_group = _group(mesh, rank, ("dp_replicate", "dp_shard"))
    if mesh.ep > 1:
        if not expert:
            want.add((_group(mesh, rank, ("dp_shard", "ep")), "S0"))
        elif mesh.dp_shard > 1:
            want.add((_group(mesh, rank, ("dp_shard",)), "S0"))
    elif mesh.dp == 1:
        pass
    elif spec.parallelism.effective_zero_stage() >= 2:
        want.add((_group(mesh, rank, ("dp_shard",)), "S0"))
        if mesh.dp_replicate > 1:
            want.add((_group(mesh, rank, ("dp_replicate",)), "R"))
    elif mesh.pp > 1 or mesh.tp > 1:
        want.add((dp_group, "R"))
    return want, optional


def _local_shape(global_shape: list[int], want: Sharding) -> list[int]:
    out = list(global_shape)
    for group, kind in want:
        if kind.startswith("S"):
            out[int(kind[1:])] //= len(group)
    return out


def check_rank(spec: JobSpec, rank: int, record: dict[str, Any],
               full: dict[str, list[int]]) -> list[str]:
    """Every way `record` (one rank's parameters) differs from what the degrees say."""
    if "error" in record:
        return [f"the loop refused a layout the spec accepts: {record['error']}"]
    mesh = MeshShape.from_parallelism(spec.parallelism)
    names = sorted(full)
    held = set(record["params"])
    want_names = _pp_names(spec, mesh, rank, names) if mesh.pp > 1 else set(names)
    problems = [f"holds {sorted(held - want_names)[:4]}, lacks {sorted(want_names - held)[:4]}"
                ] if held != want_names else []
    plain_dp = mesh.dp > 1 and mesh.ep == 1 and spec.parallelism.effective_zero_stage() < 2 and mesh.pp == mesh.tp == 1
    want_ddp = [list(_group(mesh, rank, ("dp_replicate", "dp_shard")))] if plain_dp else []
    if record["ddp_groups"] != want_ddp:
        problems.append(f"DDP groups {record['ddp_groups']}, want {want_ddp}")
    for name in sorted(held & want_names):
        p = record["params"][name]
        want, optional = expected_sharding(spec, mesh, rank, name)
        got = set()
        for (_dim, ranks), placement in zip(p.get("groups", {}).items(),
                                            p.get("placements", []), strict=True):
            if len(ranks) > 1:
                got.add((tuple(sorted(ranks)), placement))
        extra = got - want - optional
        global_shape = list(full[name])
        if ".experts." in name:
            global_shape[0] //= mesh.ep
        if want - got or extra:
            problems.append(f"{name}: placements {sorted(got)}, want {sorted(want)}")
        elif p["global_shape"] != global_shape or \
                p["local_shape"] != _local_shape(global_shape, want):
            problems.append(f"{name}: shape {p['local_shape']} of {p['global_shape']}, want "
                            f"{_local_shape(global_shape, want)} of {global_shape}")
    return problems


# --- the runs ------------------------------------------------------------------------------

def _full_shapes(spec: JobSpec) -> dict[str, list[int]]:
    from workers.loop.model import build_model

    return {n: list(p.shape) for n, p in build_model(spec, seed=0).module.named_parameters()}


def probe(tmp: Path, world: int, layouts: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """name -> the problems of every rank (empty when the layout is true)."""
    paths = []
    for name, doc in layouts.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    out = tmp / "out"
    cmd = [sys.executable, "-m", "tests.integration.workers.layout_probe", "--nproc",
           str(world), "--out", str(out), *(a for p in paths for a in ("--spec", str(p)))]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]
    problems = {}
    for name, doc in layouts.items():
        spec = parse_spec(doc)
        full = _full_shapes(spec)
        problems[name] = [f"rank {r}: {p}" for r in range(world)
                          for p in check_rank(spec, r, json.loads(
                              (out / name / f"rank_{r}.json").read_text()), full)]
    return problems


@pytest.mark.parametrize("world", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_every_accepted_layout_shards_as_its_degrees_say(tmp_path: Path, world: int) -> None:
    layouts = accepted_layouts(world)
    assert len(layouts) >= 5
    problems = probe(tmp_path, world, layouts)
    bad = {name: p[:6] for name, p in problems.items() if p}
    assert bad == {}, json.dumps(bad, indent=1)


def test_the_check_sees_a_missing_shard() -> None:
    # A TP rank holding a whole projection, and a pipeline rank holding a layer of the other
    # stage, are both reported.
    spec = parse_spec(_spec("x", {"pp": 2, "tp": 2}))
    full = _full_shapes(spec)
    mesh = MeshShape.from_parallelism(spec.parallelism)
    params = {n: {"dtensor": False, "local_shape": s, "global_shape": s}
              for n, s in full.items() if n in _pp_names(spec, mesh, 0, sorted(full))}
    problems = check_rank(spec, 0, {"params": params, "ddp_groups": []}, full)
    assert any(p.startswith("layers.0.attn.wq.weight: placements []") for p in problems)
    params["layers.2.attn_norm.weight"] = params["layers.0.attn_norm.weight"]
    assert check_rank(spec, 0, {"params": params, "ddp_groups": []}, full)[0].startswith(
        "holds ['layers.2.attn_norm.weight']")
