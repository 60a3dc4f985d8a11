"""A checkpoint save that fails on a full disk (the kernel's ENOSPC, from /dev/full standing
in for a file of the save) names the step, the host, the path and the cause, and never leaves
a folder that counts as complete; a marker that does not read whole does not count either."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from orchestrator.spec import parse_spec
from workers.loop.checkpoint import MARKER, Checkpointer, CheckpointSaveError, complete_steps

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SPEC = parse_spec({"name": "ckpt", "checkpoint": {"enabled": True, "every_steps": 2,
                                                   "keep": 3, "async_save": False}})


def _checkpointer(root: Path) -> Checkpointer:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return Checkpointer(SPEC, root=root, parts=[model], optimizer=opt, rank=0)


def _full(path: Path) -> None:
    """`path` writes into /dev/full: every write fails with ENOSPC, as on a full disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("/dev/full", path)


def test_a_save_on_a_full_disk_names_step_host_path_and_cause(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path)
    ckpt.save(2)
    assert complete_steps(tmp_path) == [2]
    data = tmp_path / "step_00000004" / "__0_0.distcp"
    _full(data)
    with pytest.raises(CheckpointSaveError) as err:
        ckpt.save(4)
    text = str(err.value)
    assert text.startswith(f"the checkpoint of step 4 was not saved on {socket.gethostname()}:")
    assert "No space left on device" in text and str(tmp_path / "step_00000004") in text
    assert "a restart resumes from step 2, the newest complete checkpoint" in text
    assert complete_steps(tmp_path) == [2]
    assert not (tmp_path / "step_00000004" / MARKER).exists()
    assert _checkpointer(tmp_path).load_latest() == 2  # what a restart loads


def test_the_rank_files_on_a_full_disk_fail_the_save_too(tmp_path: Path) -> None:
    _full(tmp_path / "step_00000002" / "rng" / "rank_0.pt")
    with pytest.raises(CheckpointSaveError) as err:
        _checkpointer(tmp_path).save(2)
    assert "step 2" in str(err.value)
    assert "no complete checkpoint is kept: a restart starts from step 0" in str(err.value)
    assert complete_steps(tmp_path) == []


def test_the_marker_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    _full(tmp_path / "step_00000002" / f".{MARKER}.tmp")
    with pytest.raises(CheckpointSaveError, match="No space left on device"):
        _checkpointer(tmp_path).save(2)
    assert not (tmp_path / "step_00000002" / MARKER).exists()
    assert complete_steps(tmp_path) == []


@pytest.mark.parametrize("marker", ["", "{", '{"step": "x"}', "[]", '{"stp": 2}'])
def test_a_marker_that_does_not_read_whole_does_not_count(tmp_path: Path, marker: str) -> None:
    (tmp_path / "step_00000002").mkdir()
    (tmp_path / "step_00000002" / MARKER).write_text(marker)
    (tmp_path / "step_00000001").mkdir()
    (tmp_path / "step_00000001" / MARKER).write_text(json.dumps({"step": 1}))
    assert complete_steps(tmp_path) == [1]


_TWO_RANKS = r"""
import json, os, sys
import torch, torch.distributed as dist
from orchestrator.spec import parse_spec
from workers.loop.checkpoint import Checkpointer, CheckpointSaveError
rank, root = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                        rank=rank, world_size=2)
spec = parse_spec({"name": "ckpt", "checkpoint": {"enabled": True, "every_steps": 2,
                                                   "keep": 3, "async_save": False}})
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
model(torch.ones(2, 8)).sum().backward()
opt.step()
try:
    Checkpointer(spec, root=root, parts=[model], optimizer=opt, rank=rank).save(2)
    print(json.dumps({"saved": True}))
except CheckpointSaveError as exc:
    print(json.dumps({"error": str(exc)}))
dist.destroy_process_group()
"""


def test_a_peer_rank_s_failed_write_is_said_as_the_peer_s_and_its_own_host_leads(
        tmp_path: Path) -> None:
    """Two gloo ranks save one checkpoint; rank 1's part lands on a full disk. DCP hands both
    ranks the gathered failure: rank 1 names its own host, rank 0 (whose part was written)
    says the save failed on peer rank 1, which reads as fallout, so the attempt's failure
    summary leads with rank 1 on its host."""
    import subprocess
    import sys

    from orchestrator.runtime.failures import RankFailure, attempt_failed

    _full(tmp_path / "step_00000002" / "__1_0.distcp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PORT": str(port)}
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_RANKS, str(r), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    errors = [json.loads(o[0].strip().splitlines()[-1])["error"] for o in outs]
    host = socket.gethostname()
    assert errors[1].startswith(f"the checkpoint of step 2 was not saved on {host}: "
                                "No space left on device"), errors[1]
    assert errors[0].startswith("the checkpoint of step 2 was not saved: it failed on peer "
                                "rank 1: No space left on device"), errors[0]
    assert complete_steps(tmp_path) == []
    failed = attempt_failed([
        RankFailure(rank=0, node="n1", error_type="CheckpointSaveError", message=errors[0],
                    time=1.0),
        RankFailure(rank=1, node="n2", error_type="CheckpointSaveError", message=errors[1],
                    time=2.0)])
    assert failed.message.startswith(f"rank 1 on n2: CheckpointSaveError: the checkpoint of "
                                     f"step 2 was not saved on {host}"), failed.message
    assert "; then rank 0 on n1 lost a peer" in failed.message, failed.message
