"""bench/startup.py's user script: examples/byo/ddp's plain DDP loop, which also reports each
step to meshyard when it runs as a meshyard job, and writes the wall-clock time of its first
step to FIRST_STEP_FILE (rank 0) when that variable is set (the torchrun peer)."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1234 + rank)
report = None
if os.environ.get("MESHYARD_JOB_ID"):
    import meshyard.train

    report = meshyard.train.report
for step in range(1, 4):
    x = torch.randn(32, 16, generator=data)
    loss = nn.functional.mse_loss(model(x).squeeze(-1), x.sum(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if report is not None:
        report({"step": step, "loss": loss.item()})
    if step == 1 and rank == 0 and os.environ.get("FIRST_STEP_FILE"):
        with open(os.environ["FIRST_STEP_FILE"], "w") as f:
            f.write(str(time.time()))
dist.barrier()  # nobody tears gloo down while a peer still talks
dist.destroy_process_group()
