"""`workers.loop.launch` with each rank's memory measured per component, for the planner's check
(tests/integration/test_planned_memory.py). Run under torchrun instead of `-m workers.loop.launch`:

    torchrun --nproc_per_node=4 tests/integration/workers/memory_probe.py --spec S --out DIR

CPU has no CUDA caching allocator to ask, so each component is measured by what this rank
holds, in bytes of distinct storages, sampled around every pipeline chunk, every FSDP
group's forward / backward hooks, the end of the schedule and the optimizer step:
- params: FSDP's sharded parameter storage, the all-gathered (unsharded) parameters while
  allocated, and parameters FSDP does not manage;
- grads: sharded gradients, the unsharded gradients FSDP accumulates while gradient sync is
  off, and the gradients of unmanaged parameters;
- optimizer: the optimizer's state tensors (AdamW's exp_avg and exp_avg_sq);
- activations: tensors autograd saved for backward (a saved_tensors_hooks pair counts each
  storage once while any saved reference to it lives), without parameters. Measured on the
  last step relative to what was still saved when that step began; `retained` is that
  leftover (torch.distributed.pipelining keeps its first-microbatch metadata-inference graph
  on the first stage).

Writes DIR[/<spec stem>]/memory_rank<R>.json: {"peak": {...}, "retained": bytes, "pp_rank"}.
"""

from __future__ import annotations

import json
import os
import sys
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

COMPONENTS = ("params", "grads", "optimizer", "activations")


class _Probe:
    def __init__(self) -> None:
        self.run: Any = None
        self.peak = dict.fromkeys(COMPONENTS, 0)
        self.live: dict[int, list[int]] = {}  # storage ptr -> [bytes, saved references]
        self.saved = 0
        self.baseline = 0
        self.step = 0


PROBE = _Probe()


class _Handle:
    __slots__ = ("key", "t", "__weakref__")

    def __init__(self, t: torch.Tensor, key: int) -> None:
        self.t, self.key = t, key


def _storage(t: torch.Tensor) -> tuple[int, int]:
    local = t._local_tensor if isinstance(t, DTensor) else t
    s = local.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _fsdp_params(parts: list[torch.nn.Module]) -> list[Any]:
    out = []
    for part in parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                for group in m._get_fsdp_state()._fsdp_param_groups:
                    out += group.fsdp_params
    return out


def _holdings(run: Any) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """(param storages, grad storages, ids of FSDP-managed parameters) of this rank."""
    parts = run.runner.model_parts
    params: dict[int, int] = {}
    grads: dict[int, int] = {}
    fps = _fsdp_params(parts)
    for fp in fps:
        params.update([_storage(fp._sharded_param_data)])
        for t in fp.all_gather_outputs:
            params.update([_storage(t)])
        held = [fp.sharded_param.grad, fp.unsharded_accumulated_grad,
                fp._unsharded_param.grad if hasattr(fp, "_unsharded_param") else None]
        grads.update(_storage(g) for g in held if g is not None)
    managed = {id(fp.sharded_param) for fp in fps}
    for part in parts:
        for p in part.parameters():
            if id(p) not in managed:
                params.update([_storage(p)])
                if p.grad is not None:
                    grads.update([_storage(p.grad)])
    return params, grads, managed


def sample() -> None:
    run = PROBE.run
    if run is None:
        return
    params, grads, _ = _holdings(run)
    opt: dict[int, int] = {}
    for state in run.optimizer.state.values():
        opt.update(_storage(t) for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
    now = {"params": sum(v for k, v in params.items() if k),
           "grads": sum(v for k, v in grads.items() if k),
           "optimizer": sum(v for k, v in opt.items() if k),
           "activations": PROBE.saved - PROBE.baseline}
    for k, v in now.items():
        PROBE.peak[k] = max(PROBE.peak[k], v)


def _pack(t: torch.Tensor) -> Any:
    key, nbytes = _storage(t)
    params, _, _ = _holdings(PROBE.run)
    if key in params:
        return t  # a parameter saved for backward is a parameter
    entry = PROBE.live.get(key)
    if entry is None:
        PROBE.live[key] = entry = [nbytes, 0]
        PROBE.saved += nbytes
    entry[1] += 1
    handle = _Handle(t, key)
    weakref.finalize(handle, _release, key)
    return handle


def _release(key: int) -> None:
    entry = PROBE.live.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        PROBE.saved -= entry[0]
        del PROBE.live[key]


def _unpack(h: Any) -> torch.Tensor:
    return h.t if isinstance(h, _Handle) else h


def _around(obj: Any, name: str) -> None:
    original = getattr(obj, name)

    def wrapped(*a: Any, **kw: Any) -> Any:
        sample()  # before: a backward chunk starts with the loss's saved logits alive
        out = original(*a, **kw)
        sample()
        return out

    setattr(obj, name, wrapped)


def install() -> None:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.pipelining.stage import _PipelineStageBase

    import workers.loop.train as loop

    for name in ("forward_one_chunk", "backward_one_chunk", "perform_reduce_grad"):
        _around(_PipelineStageBase, name)
    for name in ("post_forward", "pre_backward", "post_backward"):
        _around(FSDPParamGroup, name)
    setup = loop._setup

    def probed_setup(*a: Any, **kw: Any) -> Any:
        run = setup(*a, **kw)
        PROBE.__init__()  # type: ignore[misc]
        PROBE.run = run
        step, opt_step = run.runner.train_step, run.optimizer.step

        def train_step(*a2: Any, **kw2: Any) -> Any:
            PROBE.step += 1
            if PROBE.step == run.spec.training.steps:  # measure the last step
                PROBE.peak = dict.fromkeys(COMPONENTS, 0)
                PROBE.baseline = PROBE.saved
            with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
                out = step(*a2, **kw2)
            sample()
            return out

        def optimizer_step(*a2: Any, **kw2: Any) -> Any:
            out = opt_step(*a2, **kw2)
            sample()
            return out

        run.runner.train_step = train_step
        run.optimizer.step = optimizer_step
        return run

    loop._setup = probed_setup


def _write(run_dir: Path) -> None:
    run = PROBE.run
    rank = int(os.environ.get("RANK", "0"))
    mesh_pp = run.runner.pp_group if hasattr(run.runner, "pp_group") else None
    pp_rank = torch.distributed.get_rank(mesh_pp) if mesh_pp is not None else 0
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"memory_rank{rank}.json").write_text(json.dumps(
        {"peak": PROBE.peak, "retained": PROBE.baseline, "pp_rank": pp_rank}))


def main(argv: list[str]) -> int:
    install()
    import workers.loop.train as loop
    from workers.loop import launch
    out = Path(argv[argv.index("--out") + 1])
    specs = [Path(argv[i + 1]) for i, a in enumerate(argv) if a == "--spec"]
    run_training = loop.run_training
    done: list[Path] = []

    def measured(spec: Any, **kw: Any) -> Any:
        result = run_training(spec, **kw)
        run_dir = out / specs[len(done)].stem if len(specs) > 1 else out
        _write(run_dir)
        done.append(run_dir)
        return result

    loop.run_training = measured
    return launch.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
