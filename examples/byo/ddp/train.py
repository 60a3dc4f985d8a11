"""A plain PyTorch DDP training script, with no meshyard import.

Runs unchanged under torchrun and as a meshyard job:

    torchrun --standalone --nproc_per_node=2 train.py --steps 20
    meshyard submit spec.yaml --working-dir .

It reads torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), which meshyard
sets the same way, with the ranks placed by topology. Rank 0 prints the loss of every step.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    model = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1234 + rank)  # each rank reads its own shard
    w_true = torch.arange(16, dtype=torch.float32) / 16

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 16, generator=data)
        y = x @ w_true + 0.01 * torch.randn(args.batch, generator=data)
        loss = nn.functional.mse_loss(model(x.to(device)).squeeze(-1), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step} loss {mean.item() / world:.6f}", flush=True)
    dist.barrier()  # nobody tears gloo down while a peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
