"""FSDP2 + tensor parallelism on the mesh meshyard placed: the script builds its DeviceMesh
from MESHYARD_MESH_DIM_NAMES / MESHYARD_MESH_SHAPE, so its TP groups are the ranks the solver
put inside one NVLink domain and its data-parallel groups run across nodes in switch order.

    meshyard submit spec.yaml --working-dir .
    torchrun --standalone --nproc_per_node=4 train.py    # without meshyard: 4-way FSDP, tp 1

Each block's MLP is split column-wise / row-wise over "tp" (parallelize_module), then every
block and the root are sharded over the data-parallel dims with fully_shard (HSDP when the
job has both dp_replicate and dp_shard). Reports the loss with meshyard.train when present.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

try:
    import meshyard.train as report_to
except ImportError:  # plain torchrun without meshyard installed
    report_to = None


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        return self.head(x).squeeze(-1)


def job_mesh(device_type: str, world: int):
    names = os.environ.get("MESHYARD_MESH_DIM_NAMES", "pp,dp_replicate,dp_shard,tp").split(",")
    shape = [int(s) for s in os.environ.get("MESHYARD_MESH_SHAPE", f"1,1,{world},1").split(",")]
    return init_device_mesh(device_type, shape, mesh_dim_names=names), dict(zip(names, shape, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    device_type = "cuda" if cuda else "cpu"
    mesh, sizes = job_mesh(device_type, dist.get_world_size())
    assert sizes.get("pp", 1) == 1, "this example has no pipeline stages"
    dp_mesh = mesh["dp_replicate", "dp_shard"] if sizes["dp_replicate"] > 1 else mesh["dp_shard"]

    torch.manual_seed(0)  # every rank builds the same model before sharding
    model = Model().to(device_type)
    for block in model.layers:
        if sizes["tp"] > 1:
            parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(),
                                                   "down": RowwiseParallel()})
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    rank = dist.get_rank()
    dp_rank = rank // sizes["tp"]  # TP peers read the same batch
    data = torch.Generator().manual_seed(100 + dp_rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 32, generator=data).to(device_type)
        loss = nn.functional.mse_loss(model(x), x.sum(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        if report_to is not None and os.environ.get("MESHYARD_JOB_ID"):
            report_to.report({"step": step, "loss": mean.item()})
        if rank == 0:
            print(f"step {step} loss {mean.item():.5f} mesh {sizes}", flush=True)
    dist.barrier()  # nobody tears gloo down while a peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
