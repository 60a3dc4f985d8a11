"""DDP gradient compression: the spec's comm hooks, what they put on the wire, and their state.

Every hook is registered with a state object (`HookState` subclass) that counts, per optimizer
step, the bytes this rank hands to the gradient collectives (``wire_bytes``) against the dense
fp32 all-reduce payload of the same buckets (``dense_bytes``); `HookState.take_step_metrics`
turns them into the step metrics ``grad_comm_bytes`` and ``grad_compression_ratio``
(dense / wire). Bytes are the payload one rank contributes once (what an all-reduce or
all-gather is handed), not the algorithm's per-link traffic.

* fp16 / bf16 / PowerSGD: torch's own hooks (``default_hooks``, ``powerSGD_hook``), wrapped
  only to count bytes.
* int8: torch's per-tensor quantization (``quantization_hooks``' quantize / dequantize and
  min-max observer): uint8 per bucket with one scale and zero point per rank, exchanged by
  all-gather and averaged after dequantizing (see `_int8_hook` for why not the hook itself).
* topk: Top-K sparsification with error feedback, written here (torch ships no such hook).
  Per parameter, the gradient plus the residual left over from earlier steps is reduced to
  its ``ceil(ratio * numel)`` largest-magnitude entries; what was not sent becomes the new
  residual. Values (fp32) and indices (int32) travel in one all-gather; every rank sums the
  gathered sparse gradients in rank order, so parameters stay identical on every rank.
  Selection and residuals are per parameter (keyed by name), so they do not depend on how DDP
  lays parameters out in buckets (the layout changes after DDP's first-iteration rebuild).
  Like PowerSGD's ``start_powerSGD_iter``, ``topk_start_iter`` runs plain all-reduces for the
  first steps (a warm start) before compressing.

State that changes the trajectory is checkpointed (`HookState.state_dict`): Top-K's residuals
and iteration count, and PowerSGD's iteration count, error feedback, warm-start P/Q memories
and RNG.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook checks the hooks'
# annotations at runtime (the bucket must be annotated dist.GradBucket, not a string).
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.spec import CommHook, DDPOptions

STATE_ATTR = "_meshyard_comm_hook_state"
_FP32 = 4


class HookState:
    """Byte counters shared by every hook; subclasses add what their algorithm keeps."""

    kind = "none"

    def __init__(self, process_group: Any) -> None:
        self.process_group = process_group
        self.wire_bytes = 0
        self.dense_bytes = 0

    def count(self, bucket: dist.GradBucket, wire_bytes: int) -> None:
        self.wire_bytes += int(wire_bytes)
        self.dense_bytes += bucket.buffer().numel() * _FP32

    def take_step_metrics(self) -> dict[str, float]:
        """``grad_comm_bytes`` / ``grad_compression_ratio`` since the last call (one step),
        empty when no bucket was communicated."""
        if not self.wire_bytes:
            return {}
        out = {"grad_comm_bytes": float(self.wire_bytes),
               "grad_compression_ratio": self.dense_bytes / self.wire_bytes}
        self.wire_bytes = self.dense_bytes = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restores a saved state of the same kind; False (nothing changed) otherwise."""
        return state.get("kind") == self.kind


class CastState(HookState):
    def __init__(self, process_group: Any, kind: str) -> None:
        super().__init__(process_group)
        self.kind = kind


def _cast_hook(state: CastState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.count(bucket, bucket.buffer().numel() * 2)
    fn = default_hooks.fp16_compress_hook if state.kind == "fp16" \
        else default_hooks.bf16_compress_hook
    return fn(state.process_group, bucket)


class Int8State(HookState):
    kind = "int8"


def _int8_hook(state: Int8State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``quantization_pertensor_hook`` algorithm with its own quantize / dequantize
    functions and observer. Not the hook itself: it reads the all-gather future's value in
    NCCL's nesting (``fut.wait()[0][rank]``), which on gloo is one flat list and fails with
    "invalid index of a 0-dim tensor"; here the gathered tensors are read from the output
    lists. Each rank quantizes with its own scale / zero point (min-max observer)."""
    from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks as qh

    group = state.process_group
    world = group.size()
    tensor = bucket.buffer()
    observer = torch.ao.quantization.MinMaxObserver().to(tensor.device)
    observer(tensor)
    scale, zero_point = observer.calculate_qparams()
    s_and_z = torch.stack([scale.reshape(()).float(),
                           zero_point.reshape(()).float()]).to(tensor.device)
    all_s_and_z = [torch.empty_like(s_and_z) for _ in range(world)]
    quantized = qh._quantize_per_tensor_backend(tensor, s_and_z[0], s_and_z[1])
    all_quantized = [torch.empty_like(quantized) for _ in range(world)]
    # One uint8 per element plus the bucket's fp32 scale and zero point.
    state.count(bucket, quantized.numel() + s_and_z.numel() * _FP32)
    dist.all_gather(all_s_and_z, s_and_z, group=group)
    work = dist.all_gather(all_quantized, quantized, group=group, async_op=True)

    def dequantize_and_average(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.wait()
        out = torch.zeros_like(tensor, dtype=torch.float32)
        for q, sz in zip(all_quantized, all_s_and_z, strict=True):
            out += qh._dequantize_per_tensor_backend(q, sz[0], sz[1])
        return out.div_(world).to(tensor.dtype)

    return work.get_future().then(dequantize_and_average)


class PowerSGDHookState(HookState):
    """Wraps torch's PowerSGDState (``.inner``); its own counters give the compressed size.

    torch keys the error feedback and the P/Q memories by bucket index, in the bucket's
    layout, and DDP's layout on a resumed run's first iteration (before its rebuild) is not
    the one the saved run had. So the checkpoint holds them per parameter (split along the
    layout each bucket last had) and a resumed run lays them out again for the buckets it
    sees (`_relayout`).
    """

    kind = "powersgd"
    _PER_BUCKET = ("error_dict", "p_memory_dict", "q_memory_dict")

    def __init__(self, process_group: Any, inner: Any, *, names: dict[int, str]) -> None:
        super().__init__(process_group)
        self.inner = inner
        self.names = names  # id(parameter) -> FQN
        # bucket index -> [(name, gradient shape)] as the hook last saw it
        self.layouts: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        self._pending: dict[str, dict[str, torch.Tensor]] | None = None

    def _compressed(self, layout: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, int]]:
        """(name, Q length) of the tensors torch compresses, in its Q-memory order: grouped
        by matrix shape in order of first appearance (powerSGD_hook's shape_to_tensors)."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        by_shape: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for name, shape in layout:
            n = shape[0] if shape else 1
            m = math.prod(shape) // n
            r = min(n, m, self.inner.matrix_approximation_rank)
            if _should_compress(n, m, r, self.inner.min_compression_rate)[0]:
                by_shape.setdefault((n, m), []).append((name, m * r))
        return [item for group in by_shape.values() for item in group]

    def _layout(self, bucket: dist.GradBucket) -> list[tuple[str, tuple[int, ...]]]:
        return [(self.names[id(p)], tuple(g.shape)) for p, g in
                zip(bucket.parameters(), bucket.gradients(), strict=True)]

    def _split(self) -> dict[str, dict[str, torch.Tensor]]:
        """The error feedback and Q memories per parameter, from each bucket's last layout."""
        error: dict[str, torch.Tensor] = {}
        q: dict[str, torch.Tensor] = {}
        for idx, layout in self.layouts.items():
            if idx in self.inner.error_dict:
                parts = self.inner.error_dict[idx].split([math.prod(s) for _, s in layout])
                error.update({n: t.clone() for (n, _), t in zip(layout, parts, strict=True)})
            if idx in self.inner.q_memory_dict:
                comp = self._compressed(layout)
                parts = self.inner.q_memory_dict[idx].split([ln for _, ln in comp])
                q.update({n: t.clone() for (n, _), t in zip(comp, parts, strict=True)})
        return {"error": error, "q": q}

    def state_dict(self) -> dict[str, Any]:
        raw = self.inner.__getstate__()  # every slot but the process group
        scalars = {k: v for k, v in raw.items() if k not in self._PER_BUCKET}
        return {"kind": self.kind, "scalars": scalars, **self._split()}

    def _forget_buckets(self) -> None:
        for key in self._PER_BUCKET:
            setattr(self.inner, key, {})
        self.layouts = {}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        if not super().load_state_dict(state):
            return False
        for key, value in state["scalars"].items():
            setattr(self.inner, key, value)
        self._forget_buckets()
        self._pending = {"error": state["error"], "q": state["q"]}
        return True

    def relayout(self, bucket: dist.GradBucket) -> None:
        """Before torch's hook runs on a bucket: if the bucket's layout changed since the
        state was built (DDP's rebuild after a process's first iteration), or the state was
        restored per parameter, lays the error feedback and the warm-start memories out in
        the bucket's current layout."""
        idx = bucket.index()
        layout = self._layout(bucket)
        if self.layouts.get(idx, layout) != layout:
            self._pending = self._split()
            self._forget_buckets()
        self.layouts[idx] = layout
        if self._pending is None or idx in self.inner.error_dict:
            return
        error, q = self._pending["error"], self._pending["q"]
        if not all(n in error for n, _ in layout):
            return
        buf = bucket.buffer()
        self.inner.error_dict[idx] = torch.cat([error[n] for n, _ in layout]).to(buf)
        comp = self._compressed(layout)
        if comp and all(n in q for n, _ in comp):
            shapes = dict(layout)
            p_len = 0
            for n, _ in comp:
                rows = shapes[n][0]
                cols = math.prod(shapes[n]) // rows
                p_len += rows * min(rows, cols, self.inner.matrix_approximation_rank)
            self.inner.q_memory_dict[idx] = torch.cat([q[n] for n, _ in comp]).to(buf)
            self.inner.p_memory_dict[idx] = torch.empty(p_len, dtype=buf.dtype,
                                                        device=buf.device)


def _powersgd_hook(state: PowerSGDHookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    inner = state.inner
    compressing = inner.iter >= inner.start_powerSGD_iter
    if compressing:
        state.relayout(bucket)
    before = inner.total_numel_after_compression
    fut = powerSGD_hook.powerSGD_hook(inner, bucket)
    # Before start_powerSGD_iter the hook is a plain all-reduce; after it, its counter grows by
    # the P and Q sizes plus the tensors it sends uncompressed.
    wire = (inner.total_numel_after_compression - before) * _FP32 if compressing \
        else bucket.buffer().numel() * _FP32
    state.count(bucket, wire)
    return fut


class TopKState(HookState):
    """Top-K with error feedback: ``residuals[name]`` is what this rank has not sent yet.
    ``iter`` counts the gradient syncs (steps); before ``start_iter`` they are plain
    all-reduces."""

    kind = "topk"

    def __init__(self, process_group: Any, *, ratio: float, names: dict[int, str],
                 start_iter: int = 0) -> None:
        super().__init__(process_group)
        self.ratio = ratio
        self.names = names  # id(parameter) -> FQN
        self.start_iter = start_iter
        self.iter = 0
        self.residuals: dict[str, torch.Tensor] = {}

    def k(self, numel: int) -> int:
        return min(numel, max(1, math.ceil(self.ratio * numel)))

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ratio": self.ratio, "iter": self.iter,
                "residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        if not super().load_state_dict(state):
            return False
        self.residuals = {k: v.clone() for k, v in state["residuals"].items()}
        self.iter = int(state.get("iter", 0))
        return True


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sends each parameter's top ``ratio`` entries (after adding its residual) and returns
    the mean over ranks of the sparse gradients, dense, in the bucket's layout; before
    ``state.start_iter`` steps have run, the dense mean (a plain all-reduce)."""
    group = state.process_group
    world = group.size()
    buf = bucket.buffer()
    warm = state.iter < state.start_iter
    if bucket.is_last():
        state.iter += 1
    if warm:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        state.count(bucket, buf.numel() * _FP32)
        return default_hooks.allreduce_hook(group, bucket)
    values, indices = [], []
    offset = 0
    for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
        name = state.names[id(param)]
        flat = grad.reshape(-1).to(torch.float32)
        residual = state.residuals.get(name)
        acc = flat + residual if residual is not None else flat.clone()
        idx = torch.topk(acc.abs(), state.k(acc.numel()), sorted=False).indices
        values.append(acc[idx])
        indices.append(idx + offset)
        acc[idx] = 0.0
        state.residuals[name] = acc
        offset += acc.numel()
    if offset != buf.numel():
        raise RuntimeError(f"top-k hook: the bucket's gradients cover {offset} of its "
                           f"{buf.numel()} elements")
    vals = torch.cat(values)
    # Indices as int32 bit patterns next to the values: one all-gather per bucket.
    payload = torch.cat([vals, torch.cat(indices).to(torch.int32).view(torch.float32)])
    gathered = [torch.empty_like(payload) for _ in range(world)]
    state.count(bucket, payload.numel() * _FP32)
    work = dist.all_gather(gathered, payload, group=group, async_op=True)
    k = vals.numel()

    def combine(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.wait()
        dense = torch.zeros(buf.numel(), dtype=torch.float32, device=buf.device)
        for part in gathered:
            dense.index_add_(0, part[k:].view(torch.int32).long(), part[:k])
        return dense.div_(world).to(buf.dtype)

    return work.get_future().then(combine)


def _param_names(ddp: nn.Module) -> dict[int, str]:
    """id(parameter) -> FQN in the wrapped module (the names checkpoints use)."""
    return {id(p): n for n, p in getattr(ddp, "module", ddp).named_parameters()}


def register(ddp: nn.Module, *, opts: DDPOptions, group: Any, seed: int) -> HookState | None:
    """Registers ``opts.comm_hook`` on ``ddp`` and keeps its state on the module
    (`hook_state` finds it). None for comm_hook none."""
    hook = opts.comm_hook
    state: HookState
    if hook == CommHook.NONE:
        return None
    if hook in (CommHook.FP16, CommHook.BF16):
        state = CastState(group, hook.value)
        ddp.register_comm_hook(state, _cast_hook)
    elif hook == CommHook.INT8:
        state = Int8State(group)
        ddp.register_comm_hook(state, _int8_hook)
    elif hook == CommHook.POWERSGD:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        inner = powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=opts.powersgd_rank,
            start_powerSGD_iter=opts.powersgd_start_iter, warm_start=True, random_seed=seed)
        state = PowerSGDHookState(group, inner, names=_param_names(ddp))
        ddp.register_comm_hook(state, _powersgd_hook)
    elif hook == CommHook.TOPK:
        state = TopKState(group, ratio=opts.topk_ratio, names=_param_names(ddp),
                          start_iter=opts.topk_start_iter)
        ddp.register_comm_hook(state, topk_hook)
    else:  # pragma: no cover - CommHook is closed
        raise ValueError(f"unknown comm hook {hook!r}")
    object.__setattr__(ddp, STATE_ATTR, state)
    return state


def hook_state(module: nn.Module) -> HookState | None:
    """The comm hook state `register` kept on ``module`` (a DDP wrapper), if any."""
    return getattr(module, STATE_ATTR, None)
