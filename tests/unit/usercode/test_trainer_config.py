"""TorchTrainer's driver-side checks: what it submits, and the errors for what cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshyard.train import RunConfig, ScalingConfig
from meshyard.train._trainer import DataParallelTrainer, function_path
from orchestrator.spec import parse_spec


def top_level(config):
    return config


def test_a_module_level_function_becomes_the_job_spec() -> None:
    t = DataParallelTrainer(top_level, train_loop_config={"lr": 0.1},
                            scaling_config=ScalingConfig(num_workers=3,
                                                         resources_per_worker={"CPU": 0.5}),
                            run_config=RunConfig(name="x", storage_path="/tmp/res"))
    req = t._request()
    path, root = function_path(top_level)
    assert path == f"{__name__}:top_level"
    assert (root / Path(*__name__.split("."))).with_suffix(".py") == Path(__file__)
    assert req["working_dir"] == str(root) and req["results_dir"] == "/tmp/res/x"
    spec = parse_spec(req["spec"])  # the service's own validation accepts it
    assert spec.world_size == 3 and spec.resources.cpus_per_worker == 0.5
    assert spec.entrypoint is not None and spec.entrypoint.config == {"lr": 0.1}
    assert spec.fault_tolerance.max_failures == 0  # Ray Train's default


def test_what_cannot_run_is_refused_with_the_fix() -> None:
    def nested(config):
        return config

    with pytest.raises(ValueError, match="top level of a module"):
        DataParallelTrainer(nested)._request()
    with pytest.raises(ValueError, match="top level of a module"):
        DataParallelTrainer(lambda c: c)._request()
    with pytest.raises(ValueError, match="train_loop_config must be JSON"):
        DataParallelTrainer(top_level, train_loop_config={"model": object()})._request()
    with pytest.raises(ValueError, match="num_workers"):
        ScalingConfig(num_workers=0)
    with pytest.raises(ValueError, match="CPU and GPU only"):
        ScalingConfig(resources_per_worker={"TPU": 1})
    with pytest.raises(ValueError, match="Ray Data"):
        DataParallelTrainer(top_level, datasets={"train": [1]})
    with pytest.raises(TypeError, match="dataset_config"):
        DataParallelTrainer(top_level, dataset_config=1)


def test_fit_inside_a_rank_says_to_guard_the_driver(monkeypatch) -> None:
    monkeypatch.setenv("MESHYARD_JOB_ID", "j1")
    with pytest.raises(RuntimeError, match="__main__"):
        DataParallelTrainer(top_level).fit()
