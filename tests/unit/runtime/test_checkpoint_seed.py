"""`checkpoint.resume_from`: the spec field's bounds and the copy into the new job's
checkpoints (never through a link, the marker last, once)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshyard._protocol import MARKER, complete_checkpoints
from orchestrator.isolation.runfiles import checkpoint_place
from orchestrator.runtime.checkpoint_seed import SeedError, seed_checkpoint
from orchestrator.spec import SpecValidationError, parse_spec

SRC = "job-0123456789ab"
DST = "job-ffffffffffff"


def _seed(spec, runs: Path, *, dst: str = DST, storage: Path | None = None):
    """As the controller seeds: both places in the runs dir, or on the storage."""
    return seed_checkpoint(spec, into=checkpoint_place(dst, runs_dir=runs, storage=storage),
                           source=checkpoint_place(spec.checkpoint.resume_from.job
                                                   if spec.checkpoint.resume_from else SRC,
                                                   runs_dir=runs, storage=storage))


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
    run_dir = tmp_path / DST
    assert _seed(_spec(), tmp_path) == 4
    copied = run_dir / "checkpoints" / "step_00000004"
    assert {p.relative_to(copied).as_posix(): p.read_bytes() for p in copied.rglob("*")
            if p.is_file()} == {**files, MARKER: b'{"step": 4}'}
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [4]
    assert not list((run_dir / "checkpoints").glob(".*"))  # no partial folder left
    assert _seed(_spec(), tmp_path) is None  # in place: not copied again
    assert _seed(parse_spec({"name": "plain"}), tmp_path) is None


def test_a_pruned_checkpoint_or_a_link_in_it_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / DST
    with pytest.raises(SeedError, match="no longer keeps a complete checkpoint of step 4"):
        _seed(_spec(), tmp_path)
    folder = _checkpoint(tmp_path, SRC, 4, {"a.distcp": b"x"})
    secret = tmp_path / "secret"
    secret.write_text("admin token")
    os.symlink(secret, folder / "b.distcp")
    with pytest.raises(SeedError, match="symbolic link"):
        _seed(_spec(), tmp_path)
    assert not (run_dir / "checkpoints" / "step_00000004").exists()
    # the source's checkpoints folder itself a link out of its run dir: refused too
    other = tmp_path / "job-aaaaaaaaaaaa"
    other.mkdir()
    os.symlink(tmp_path / SRC / "checkpoints", other / "checkpoints")
    with pytest.raises(SeedError):
        _seed(_spec(job="job-aaaaaaaaaaaa"), tmp_path)


def test_on_checkpoint_storage_the_copy_goes_between_the_jobs_folders_there(
        tmp_path: Path) -> None:
    storage, runs = tmp_path / "storage", tmp_path / "runs"
    src = storage / SRC / "step_00000004"
    src.mkdir(parents=True)
    (src / "__0_0.distcp").write_bytes(b"weights")
    (src / MARKER).write_text('{"step": 4}')
    assert _seed(_spec(), runs, storage=storage) == 2
    assert [s for s, _ in complete_checkpoints(storage / DST)] == [4]
    assert not runs.exists()  # nothing under the run dirs
    # the source job's folder on the storage a link (its ranks cannot make one, an operator
    # could): the anchor is the storage, so the link is refused, not followed
    (storage / "job-aaaaaaaaaaaa").symlink_to(storage / SRC)
    with pytest.raises(SeedError, match="not copied|no longer keeps"):
        _seed(_spec(job="job-aaaaaaaaaaaa"), runs, dst="job-bbbbbbbbbbbb", storage=storage)
