"""Ray Train programs, ported by their import lines only (examples/byo/raytrain_driver), run
against a real `meshyard serve` (its own local Ray): `TorchTrainer(...).fit()` submits the
training function as a job on N ranks, streams the ranks' logs, and returns a Result with rank
0's last metrics and a loadable checkpoint; a raising function fails fit() like Ray's, naming
the exception. With no service named, fit() starts an embedded one."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import Server, run_server

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "byo" / "raytrain_driver"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("meshyard-raytrain"), scheduler=True) as s:
        yield s


@pytest.fixture
def named(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    monkeypatch.setenv("MESHYARD_URL", server.url)
    monkeypatch.setenv("MESHYARD_TOKEN", server.token)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return server


def _example(name: str):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_linear_example_trains_on_two_ranks_and_returns_metrics_and_checkpoint(
        named: Server, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    result = _example("linear").train_linear(num_workers=2, epochs=3, storage_path=str(tmp_path))
    assert result.error is None
    assert result.metrics is not None and result.metrics["epoch"] == 2
    assert result.metrics["step"] == 3 and 0 <= result.metrics["loss"] < 100
    # The checkpoint is the newest complete one, copied under storage_path/name, loadable.
    assert result.path == str(tmp_path / "linear")
    assert result.checkpoint is not None
    assert Path(result.checkpoint.path) == tmp_path / "linear" / "checkpoint_000003"
    with result.checkpoint.as_directory() as d:
        state = torch.load(Path(d) / "model.pt")
    weight = state.get("module.weight", state.get("weight"))
    assert weight is not None and weight.shape == (1, 1)
    with named.client() as c:
        job = c.get(f"/v1/jobs/{result.job_id}").json()
        assert job["state"] == "SUCCEEDED" and job["world_size"] == 2
        assert job["spec"]["entrypoint"]["function"] == "linear:train_func"
        assert job["spec"]["entrypoint"]["config"]["epochs"] == 3
        ranks = c.get(f"/v1/jobs/{result.job_id}/ranks").json()["items"]
        assert sorted(r["rank"] for r in ranks) == [0, 1]
        metrics = c.get(f"/v1/jobs/{result.job_id}/metrics").json()["items"]
        assert sorted((m["rank"], m["step"]) for m in metrics) == [
            (r, s) for r in (0, 1) for s in (1, 2, 3)]
        assert result.metrics["loss"] == pytest.approx(
            [m["loss"] for m in metrics if m["rank"] == 0 and m["step"] == 3][0])
        ckpts = c.get(f"/v1/jobs/{result.job_id}/checkpoints").json()["items"]
        assert [k["step"] for k in ckpts] == [1, 2, 3]
    out = capfd.readouterr().out
    assert f"meshyard: job {result.job_id} submitted (2 ranks)" in out


def test_quick_start_script_runs_unchanged_as_its_own_driver(named: Server,
                                                              tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "quick_start.py"], cwd=EXAMPLE, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sum(1 for x in lines if x.startswith("epoch: ")) == 2  # the single-process run
    for rank in (0, 1):  # each rank's output, streamed to the driver
        assert any(x.startswith(f"(rank {rank}) epoch: 1, loss: ") for x in lines), lines
    assert lines[-1] == "world size 2 error None"
    job_id = next(x.split()[2] for x in lines if x.startswith("meshyard: job "))
    with named.client() as c:
        job = c.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "SUCCEEDED" and job["world_size"] == 2
    assert job["spec"]["entrypoint"]["function"] == "quick_start:train_func_distributed"


def test_a_raising_train_func_fails_fit_naming_the_exception(named: Server,
                                                             tmp_path: Path) -> None:
    from meshyard.train import TrainingFailedError

    with pytest.raises(TrainingFailedError) as info:
        _example("fails").run(storage_path=str(tmp_path))
    err = info.value
    assert "ValueError" in str(err) and "bad learning rate -1" in str(err), str(err)
    result = err.result  # type: ignore[attr-defined]
    assert result.error is err and result.checkpoint is None
    assert result.metrics is not None and result.metrics["loss"] == 1.0
    with named.client() as c:
        job = c.get(f"/v1/jobs/{err.job_id}").json()
    assert job["state"] == "FAILED"


def test_fit_with_no_service_named_starts_an_embedded_one(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    for var in ("MESHYARD_URL", "MESHYARD_TOKEN", "MESHYARD_DATA_DIR", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    result = _example("linear").train_linear(num_workers=2, epochs=1, storage_path=str(tmp_path))
    assert result.error is None and result.metrics is not None
    assert result.metrics["epoch"] == 0
    assert result.checkpoint is not None
    assert (Path(result.checkpoint.path) / "model.pt").is_file()
    service = tmp_path / "linear" / "service"
    assert (service / "meshyard.db").is_file()
    assert (service / "runs" / result.job_id / "checkpoints" / "step_00000001" / "COMPLETE"
            ).is_file()
