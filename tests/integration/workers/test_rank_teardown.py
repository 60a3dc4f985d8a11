"""A user's rank ends after its last step however its script frees its model: two rank
processes started as the service starts them (`python -m meshyard.runner script ...`, the
hang watchdog's probe on), each running 60 rounds of what a plain DDP script does last
(a step, `barrier()`, `destroy_process_group()`, then the function returns and frees its DDP
model), both pinned to one CPU so that the gloo worker threads and the main threads
interleave as on a loaded host.

Without the probe's teardown guard keeping the destroyed groups (meshyard/_probe.py,
`_keep_groups`), the freed Reducer drops the group's last reference with the GIL held and
~ProcessGroupGloo joins a gloo thread that waits for that GIL: here the ranks stopped at
rounds 7-8 in both tries; the product saw it as a job whose rank 0 exited 0 and whose rank 1
never did.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROUNDS = 60

SCRIPT = r'''
import os, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

rank, world, d = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["STORE_DIR"]
torch.set_num_threads(1)
deadline = time.monotonic() + 30  # the probe wraps destroy_process_group at its next wake
while not getattr(dist.destroy_process_group, "_meshyard_guarded", False):
    assert time.monotonic() < deadline, "destroy_process_group was never guarded"
    time.sleep(0.05)


def one_round(i):
    dist.init_process_group("gloo", init_method=f"file://{d}/store-{i}", rank=rank,
                            world_size=world)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        loss = model(torch.randn(32, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
    dist.barrier()
    dist.destroy_process_group()


for i in range(int(sys.argv[1])):
    one_round(i)  # returns: its DDP model, Reducer and tensors are freed here
    with open(f"{d}/rank{rank}.rounds", "w") as f:
        f.write(str(i + 1))
'''


def _rounds(store: Path, rank: int) -> int:
    try:
        return int((store / f"rank{rank}.rounds").read_text() or 0)
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_ranks_that_free_their_ddp_model_after_destroy_process_group_exit(tmp_path: Path):
    script, store, probe = tmp_path / "teardown.py", tmp_path / "store", tmp_path / "probe"
    script.write_text(SCRIPT)
    store.mkdir()
    cpu = min(os.sched_getaffinity(0))
    procs = []
    for rank in range(2):
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "WORLD_SIZE": "2", "STORE_DIR": str(store),
               "MESHYARD_PROBE_DIR": str(probe)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "meshyard.runner", "script", str(script), str(ROUNDS)],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu})))
    try:
        # Bounded by progress, not by a total: a round takes well under a second, so a rank
        # that has not finished one in 60 s is stuck.
        seen, moved = (0, 0), time.monotonic()
        while any(p.poll() is None for p in procs):
            now = (_rounds(store, 0), _rounds(store, 1))
            if now != seen:
                seen, moved = now, time.monotonic()
            assert time.monotonic() - moved < 60, \
                f"a rank stopped making rounds: rounds done {now} of {ROUNDS}, " \
                f"still running: {[p.pid for p in procs if p.poll() is None]}"
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            out = p.communicate(timeout=30)[0]
            if p.returncode:
                print(out.decode(errors="replace")[-4000:], file=sys.stderr)
    assert [p.returncode for p in procs] == [0, 0]
    assert (_rounds(store, 0), _rounds(store, 1)) == (ROUNDS, ROUNDS)
