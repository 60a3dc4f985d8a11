"""`checkpoint.resume_from`: the spec field's bounds and the copy into the new job's
checkpoints (never through a link, the marker last, once)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshyard._protocol import MARKER, complete_checkpoints
from orchestrator.runtime.checkpoint_seed import SeedError, seed_checkpoint
from orchestrator.spec import SpecValidationError, parse_spec

SRC = "job-0123456789ab"


def _spec(step: int = 4, job: str = SRC):
    return parse_spec({"name": "resumed", "checkpoint": {"resume_from": {"job": job,
                                                                          "step": step}}})


def _checkpoint(runs: Path, job: str, step: int, files: dict[str, bytes]) -> Path:
    folder = runs / job / "checkpoints" / f"step_{step:08d}"
    for name, data in {**files, MARKER: b'{"step": %d}' % step}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("bad", [{"job": "../etc", "step": 1}, {"job": SRC, "step": -1},
                                 {"job": SRC, "step": 10**12}, {"job": SRC}])
def test_resume_from_is_bounded(bad: dict) -> None:
    with pytest.raises(SpecValidationError) as err:
        parse_spec({"name": "x", "checkpoint": {"resume_from": bad}})
    assert "checkpoint.resume_from" in str(err.value)


def test_the_checkpoint_is_copied_marker_last_once(tmp_path: Path) -> None:
    files = {"__0_0.distcp": os.urandom(300_000), "rng/rank_0.pt": b"rng", ".metadata": b"m"}
    _checkpoint(tmp_path, SRC, 4, files)
    run_dir = tmp_path / "job-ffffffffffff"
    assert seed_checkpoint(_spec(), run_dir=run_dir) == 4
    copied = run_dir / "checkpoints" / "step_00000004"
    assert {p.relative_to(copied).as_posix(): p.read_bytes() for p in copied.rglob("*")
            if p.is_file()} == {**files, MARKER: b'{"step": 4}'}
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [4]
    assert not list((run_dir / "checkpoints").glob(".*"))  # no partial folder left
    assert seed_checkpoint(_spec(), run_dir=run_dir) is None  # in place: not copied again
    assert seed_checkpoint(parse_spec({"name": "plain"}), run_dir=run_dir) is None


def test_a_pruned_checkpoint_or_a_link_in_it_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "job-ffffffffffff"
    with pytest.raises(SeedError, match="no longer keeps a complete checkpoint of step 4"):
        seed_checkpoint(_spec(), run_dir=run_dir)
    folder = _checkpoint(tmp_path, SRC, 4, {"a.distcp": b"x"})
    secret = tmp_path / "secret"
    secret.write_text("admin token")
    os.symlink(secret, folder / "b.distcp")
    with pytest.raises(SeedError, match="symbolic link"):
        seed_checkpoint(_spec(), run_dir=run_dir)
    assert not (run_dir / "checkpoints" / "step_00000004").exists()
    # the source's checkpoints folder itself a link out of its run dir: refused too
    other = tmp_path / "job-aaaaaaaaaaaa"
    other.mkdir()
    os.symlink(tmp_path / SRC / "checkpoints", other / "checkpoints")
    with pytest.raises(SeedError):
        seed_checkpoint(_spec(job="job-aaaaaaaaaaaa"), run_dir=run_dir)
