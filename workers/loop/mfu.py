"""Model FLOPs utilisation on CUDA: achieved model FLOP/s over the GPUs' dense bf16 peak.

FLOPs per token follow the PaLM / nanoGPT estimate: 6 * parameters (forward + backward of the
matmuls) + 12 * layers * d_model * seq_len (attention scores). The peak is looked up by device
name; unknown devices (and CPUs) give no MFU rather than a guess.
"""

from __future__ import annotations

import torch

# Dense bf16 tensor-core peak per GPU (FLOP/s), from the vendors' datasheets (SXM parts).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 125e12),
    ("V100", 125e12),
)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def flops_per_token(*, n_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    return 6.0 * n_params + 12.0 * n_layers * d_model * seq_len


def mfu(*, tokens_per_s: float, flops_per_token: float, peak: float, world_size: int) -> float:
    return tokens_per_s * flops_per_token / (peak * world_size)
