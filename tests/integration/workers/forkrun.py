"""A local launch of ``workers.loop.launch`` whose ranks are forked from one process that imported
torch and the training loop once, for the parity tests, where what is compared is the
training and not the launcher. Under torchrun every rank imports torch, torch._dynamo (DDP
and FSDP need it) and the loop on its own, about 2.5 s of CPU before its first step; these
tests start dozens of ranks. The tests about torchrun itself (its process tree, a rank that
dies, hangs or is killed, its log redirects, the examples people launch with it, and one
launch of each parity module) keep launching torchrun.

Each rank gets what torchrun gives it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT), shares this process's stdout and stderr, and exits
through the interpreter's normal shutdown. When a rank fails the others are killed, as
torchrun does, and this process exits with the first failure's status; a rank dies with
this process.

    python -m tests.integration.workers.forkrun --nproc N [workers.loop.launch arguments...]
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

# What a rank of the tiny specs imports before its first step (~2 s of CPU), once.
import torch  # noqa: F401
import torch._dynamo  # noqa: F401
import torch.distributed.checkpoint  # noqa: F401
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.pipelining  # noqa: F401
import torch.distributed.tensor  # noqa: F401
import torch.nn.parallel  # noqa: F401

import workers.host.env
import workers.loop.checkpoint  # noqa: F401
import workers.loop.launch
import workers.loop.moe  # noqa: F401
import workers.loop.parallelize  # noqa: F401
import workers.loop.pipeline  # noqa: F401
import workers.loop.train  # noqa: F401

_PR_SET_PDEATHSIG = 1


def run_forked(*, nproc: int, specs: list[Path], out: Path, extra: list[str],
               env: Mapping[str, str], cwd: Path,
               timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs `workers.loop.launch --out OUT --spec S... EXTRA` on `nproc` forked ranks, as the test
    helpers' `torchrun` does under torchrun."""
    cmd = [sys.executable, "-m", "tests.integration.workers.forkrun", "--nproc", str(nproc),
           "--out", str(out), *(a for s in specs for a in ("--spec", str(s))), *extra]
    return subprocess.run(cmd, cwd=cwd, env=dict(env), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _rank(rank: int, world: int, port: int, argv: list[str],
          entry: Callable[[list[str]], int]) -> None:
    """In the forked child: become rank `rank`, run `entry(argv)`, exit with its status."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.exit(entry(argv))


def main(args: list[str], *, entry: Callable[[list[str]], int] = workers.loop.launch.main) -> int:
    """`--nproc N ARGV...`: runs `entry(ARGV)` (default `workers.loop.launch.main`) on N forked
    ranks."""
    if len(args) < 2 or args[0] != "--nproc":
        print(__doc__, file=sys.stderr)
        return 2
    world, argv = int(args[1]), args[2:]
    port = workers.host.env.free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _rank(rank, world, port, argv, entry)
        children[pid] = rank
    status = 0
    while children:
        pid, wait_status = os.wait()
        rank = children.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(wait_status)
        if code != 0 and status == 0:
            print(f"forkrun: rank {rank} exited {code}; stopping the others", file=sys.stderr,
                  flush=True)
            status = code if code > 0 else 128 - code
            for other in children:
                os.kill(other, signal.SIGKILL)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
