"""Where a job's checkpoints live: the cluster's checkpoint storage or the run dir, and the
rule that a gang spread over hosts keeps no checkpoint on host-local disks."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from orchestrator.runtime import checkpoint_storage
from orchestrator.runtime.checkpoint_storage import host_local_checkpoints
from orchestrator.settings import Settings


def test_docstring_examples() -> None:
    assert doctest.testmod(checkpoint_storage).failed == 0


def test_a_gang_on_two_hosts_with_host_local_checkpoints_is_refused_naming_the_setting() -> None:
    why = host_local_checkpoints(enabled=True, shared=False, root="/runs/j1/checkpoints",
                                 ips={0: "198.18.0.11", 1: "198.18.0.12", 2: "198.18.0.11"})
    assert why is not None
    assert "2 hosts (198.18.0.11, 198.18.0.12)" in why
    assert "/runs/j1/checkpoints" in why
    assert "MESHYARD_CHECKPOINT_STORAGE" in why and "--checkpoint-storage" in why
    assert "checkpoint.enabled: false" in why


def test_user_code_is_told_to_keep_no_checkpoint_not_to_change_a_field_it_cannot_set() -> None:
    why = host_local_checkpoints(enabled=True, shared=False, root="/r",
                                 ips={0: "10.0.0.1", 1: "10.0.0.2"}, user_code=True)
    assert why is not None and why.endswith("or keep no checkpoint in this job")
    assert "checkpoint.enabled" not in why


@pytest.mark.parametrize("case", [
    {"enabled": False, "shared": False, "ips": {0: "10.0.0.1", 1: "10.0.0.2"}},  # none kept
    {"enabled": True, "shared": True, "ips": {0: "10.0.0.1", 1: "10.0.0.2"}},  # shared
    {"enabled": True, "shared": False, "ips": {0: "127.0.0.1", 1: "127.0.0.1"}},  # one host
    {"enabled": True, "shared": False, "ips": {0: "10.0.0.1", 1: None}},  # unknown: one seen
])
def test_what_is_let_start(case: dict) -> None:
    assert host_local_checkpoints(root="/r", **case) is None


def test_many_hosts_are_counted_not_all_listed() -> None:
    why = host_local_checkpoints(enabled=True, shared=False, root="/r",
                                 ips={i: f"10.0.0.{i}" for i in range(10)})
    assert why is not None and "10 hosts" in why and "and 6 more" in why
    assert "10.0.0.9" not in why


def test_settings_place_checkpoints_on_the_storage_and_hide_it_from_jobs(tmp_path: Path) -> None:
    plain = Settings(data_dir=tmp_path / "d")
    anchor, rel = plain.checkpoint_place("job-1")
    assert (anchor, rel) == ((tmp_path / "d" / "runs").resolve(), Path("job-1/checkpoints"))
    storage = tmp_path / "shared"
    shared = Settings(data_dir=tmp_path / "d", checkpoint_storage=storage)
    assert shared.checkpoint_place("job-1") == (storage.resolve(), Path("job-1"))
    assert str(storage.resolve()) in shared.job_confinement().hide
    assert str(storage.resolve()) not in plain.job_confinement().hide
