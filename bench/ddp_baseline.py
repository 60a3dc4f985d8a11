"""A minimal hand-written torchrun DDP training loop: the baseline bench/throughput.py runs.

    torchrun --nproc_per_node=2 bench/ddp_baseline.py --config CONFIG.json --out TIMES.json

What a user would write without meshyard: init the group, build the same GPT
(``workers.loop.model.GPT``, so the FLOPs are identical), wrap it in DDP with the same bucket size,
AdamW, clip to the same norm, one ``loss.item()`` per step for logging. Rank 0 writes the wall
clock and its CPU time at the end of every step, the same point meshyard's metrics record.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from orchestrator.spec import GPTModel
from workers.loop.model import GPT


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = json.loads(Path(args.config).read_text())
    cuda = torch.cuda.is_available() and cfg.get("device", "auto") != "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()

    torch.manual_seed(cfg["seed"])
    mcfg = GPTModel(**cfg["model"])
    model = DDP(GPT(mcfg).to(device), bucket_cap_mb=cfg["bucket_cap_mb"],
                device_ids=[local_rank] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    b, t, v = cfg["micro_batch_size"], mcfg.seq_len, mcfg.vocab_size

    times, cpu = [], []
    for _ in range(cfg["steps"]):
        rows = torch.randint(0, v, (b, t + 1), generator=gen).to(device)
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, v).float(), rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.time())
        cpu.append(time.process_time())
    if rank == 0:
        Path(args.out).write_text(json.dumps({"times": times, "cpu": cpu}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
