"""A small training script as a user writes it (plain torch.distributed, nothing of
meshyard), with one fault chosen on the command line:

    python hangs.py SCENARIO CULPRIT [--steps N]

    healthy         every rank trains N steps and exits 0
    not_joined      rank CULPRIT saves a checkpoint (sleeps) before step 6's all_reduce
    exited          rank CULPRIT returns after step 5 and exits 0; its peers wait
    mismatch        rank CULPRIT all_reduces 100 floats at step 6, its peers 16
    p2p             pipeline 0 -> 1 -> ...: stage CULPRIT never sends its activations
    non_collective  every rank waits for data in a Python loop at step 6
    straggler       rank CULPRIT computes 3x longer per step, N steps, exits 0
    hang_once       first attempt: like not_joined; a restarted attempt (TORCHELASTIC_
                    RESTART_COUNT > 0) starts slowly (every rank sleeps 8 s, as a large
                    import or data load does), then trains N steps and exits 0
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HANG_AT = 6
STEP_S = 0.05


def save_checkpoint(step: int) -> None:
    time.sleep(600)  # a checkpoint save that never returns


def wait_for_data() -> None:
    while True:
        time.sleep(0.05)


def forward(step: int, rank: int, args: argparse.Namespace) -> None:
    slow = args.scenario == "straggler" and rank == args.culprit
    time.sleep(STEP_S * (3 if slow else 1))


def pipeline_step(t: torch.Tensor, rank: int, world: int, culprit: int) -> None:
    if rank > 0:
        dist.recv(t, src=rank - 1)
    if rank == culprit:
        save_checkpoint(HANG_AT)  # the stage stops before sending downstream
    if rank < world - 1:
        dist.send(t, dst=rank + 1)


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(16)
    for step in range(args.steps):
        forward(step, rank, args)
        if step == HANG_AT:
            print(f"rank {rank} reached the fault at {time.time():.3f}", flush=True)
            if args.scenario in ("not_joined", "hang_once") and rank == args.culprit:
                save_checkpoint(step)
            elif args.scenario == "exited" and rank == args.culprit:
                return
            elif args.scenario == "mismatch" and rank == args.culprit:
                t = torch.ones(100)
            elif args.scenario == "p2p":
                pipeline_step(t, rank, world, args.culprit)
            elif args.scenario == "non_collective":
                wait_for_data()
        dist.all_reduce(t)
        t.fill_(1.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("culprit", type=int)
    p.add_argument("--steps", type=int, default=10_000)
    args = p.parse_args()
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if args.scenario == "hang_once" and restarted:
        time.sleep(8.0)
        args.scenario = "healthy"
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    train(args)
    if args.scenario in ("healthy", "straggler"):
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
