"""A spec that parses but cannot run fails fast on every rank with a clear error, not a hang.

The model (and so a user import path) is built before the process group is joined, so each
rank fails by itself; nobody waits in a rendezvous or a collective for a peer that died.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.workers.launch_helpers import torchrun, variant
from workers.host.env import DistEnv
from workers.loop.launch import load_spec
from workers.loop.model import ModelBuildError
from workers.loop.train import run_training

MISSING = {"kind": "import", "path": "tests.integration.workers.no_such_module:build",
           "vocab_size": 128, "seq_len": 32}


def test_bad_import_path_fails_on_every_rank(tmp_path: Path) -> None:
    spec = variant("ddp", tmp_path, name="bad-import", model=MISSING)
    logs = tmp_path / "logs"
    proc = torchrun(nproc=2, specs=[spec], out=tmp_path / "run", log_dir=logs, timeout=120)
    assert proc.returncode != 0
    stderr = sorted(logs.rglob("stderr.log"))
    assert len(stderr) == 2
    named = [f for f in stderr if "ModelBuildError" in f.read_text()]
    assert named, [f.read_text()[-3000:] for f in stderr]
    for f in named:
        assert "cannot import module 'tests.integration.workers.no_such_module'" in f.read_text()
    if len(named) < len(stderr):
        # torchrun stops the other ranks once one fails: on a loaded host a rank still
        # importing torch then is ended by its agent before it reaches the model build
        agent = proc.stdout + proc.stderr
        assert "closing signal SIGTERM" in agent, agent[-3000:]


@pytest.mark.timeout(60)
def test_bad_import_fails_before_joining_the_group(tmp_path: Path) -> None:
    # World of 2 with no peer: joining would block for the 600 s init timeout (and trip the
    # 60 s test timeout). The error must come before that.
    spec = load_spec(variant("ddp", tmp_path, name="bad-import", model=MISSING))
    env = DistEnv(rank=0, local_rank=0, world_size=2, local_world_size=2,
                  master_addr="127.0.0.1", master_port=1)
    with pytest.raises(ModelBuildError, match="cannot import module"):
        run_training(spec, out_dir=tmp_path / "run", dist_env=env)


def test_build_returning_a_non_module_is_named(tmp_path: Path) -> None:
    model = {**MISSING, "path": "tests.integration.workers.user_model:build_not_a_module"}
    spec = load_spec(variant("ddp", tmp_path, name="bad-return", model=model))
    with pytest.raises(ModelBuildError, match="returned int, not a torch.nn.Module"):
        run_training(spec, out_dir=tmp_path / "run", reference=True)
