"""A host's checkpoint uploads and downloads (workers/host/checkpoint_transfer.py) and the
store's bookkeeping (orchestrator/storage/object_storage.py), against a real S3-compatible
server on 127.0.0.1: what a job wrote goes up without its marker and without anything a
link points at; a download empties the job's folder first and lands the marker last; the
store counts only steps with a marker, prunes, copies and refuses what it must."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshyard._protocol import MARKER, complete_checkpoints
from orchestrator.settings import Settings
from orchestrator.storage.object_storage import ObjectStorage, StorageError
from tests.support.s3 import Gate, keys
from workers.host.checkpoint_transfer import (
    StoreTransferError,
    TransferError,
    restore_step,
    upload_step,
)

JOB = "job-ckpt"


def _step(run: Path, step: int, files: dict[str, bytes], *, marker: bool = True) -> Path:
    d = run / "checkpoints" / f"step_{step:08d}"
    for name, data in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    if marker:
        (d / MARKER).write_text(json.dumps({"step": step}))
    return d


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    r = tmp_path / "runs" / JOB
    r.mkdir(parents=True)
    return r


def test_upload_sends_the_hosts_files_not_the_marker_and_prunes_older_local_steps(
        storage: ObjectStorage, run: Path) -> None:
    for step in (2, 4):
        _step(run, step, {"__0_0.distcp": b"a" * 1000, "rng/rank_0.pt": b"r"})
    _step(run, 6, {"__0_0.distcp": b"b" * 3000, ".metadata": b"m", "rng/rank_0.pt": b"r"})
    got = upload_step(storage, job_id=JOB, run_dir=str(run), step=6, keep=2)
    assert got["files"] == 3 and got["bytes"] == 3002
    assert keys(storage, JOB) == ["step_00000006/.metadata", "step_00000006/__0_0.distcp",
                                  "step_00000006/rng/rank_0.pt"]
    # no marker in the store yet: the step does not count until the controller writes it
    assert storage.complete_steps(JOB) == []
    storage.write_marker(JOB, 6, {"step": 6})
    assert storage.complete_steps(JOB) == [6]
    # keep=2: this host keeps steps 4 and 6 on its disk
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000004",
                                                                        "step_00000006"]


def test_a_link_in_the_step_refuses_the_upload_and_nothing_it_points_at_leaves(
        storage: ObjectStorage, run: Path, tmp_path: Path) -> None:
    secret = tmp_path / "other-job-secret"
    secret.write_text("do not upload")
    d = _step(run, 2, {"__0_0.distcp": b"a"})
    os.symlink(secret, d / "stolen.bin")
    with pytest.raises(TransferError, match=r"refused to upload the checkpoint of step 2 .*"
                       r"stolen.bin is a symbolic link"):
        upload_step(storage, job_id=JOB, run_dir=str(run), step=2, keep=1)
    assert keys(storage, JOB) == []
    # the job's whole checkpoints folder a link elsewhere: refused the same way
    (run / "checkpoints").rename(run / "moved")
    os.symlink(run / "moved", run / "checkpoints")
    with pytest.raises(TransferError, match="refused to upload"):
        upload_step(storage, job_id=JOB, run_dir=str(run), step=2, keep=1)
    assert keys(storage, JOB) == []


def test_a_step_gone_from_the_host_is_named(storage: ObjectStorage, run: Path) -> None:
    with pytest.raises(TransferError, match=r"could not upload the checkpoint of step 8 on .*"
                       r"its folder is gone from this host"):
        upload_step(storage, job_id=JOB, run_dir=str(run), step=8, keep=1)


def test_restore_empties_the_folder_then_downloads_the_step_marker_included(
        storage: ObjectStorage, run: Path, tmp_path: Path) -> None:
    src = tmp_path / "runs-a" / JOB
    src.mkdir(parents=True)
    _step(src, 4, {"__0_0.distcp": b"x" * 5000, "rng/rank_1.pt": b"r1"})
    upload_step(storage, job_id=JOB, run_dir=str(src), step=4, keep=1)
    storage.write_marker(JOB, 4, {"step": 4, "attempt": 1})
    # this host has a newer local step that never reached the store (its upload was cut
    # off), complete on this disk alone: it must not be resumed from
    _step(run, 6, {"__0_0.distcp": b"stale"})
    got = restore_step(storage, job_id=JOB, run_dir=str(run), step=4)
    assert got["files"] == 3 and got["bytes"] == 5002 + len(json.dumps({"step": 4,
                                                                         "attempt": 1}))
    assert [s for s, _ in complete_checkpoints(run / "checkpoints")] == [4]
    d = run / "checkpoints" / "step_00000004"
    assert (d / "__0_0.distcp").read_bytes() == b"x" * 5000
    assert (d / "rng" / "rank_1.pt").read_bytes() == b"r1"
    # a host no job ran on yet: its runs dir is made
    fresh = tmp_path / "runs-new" / JOB
    assert restore_step(storage, job_id=JOB, run_dir=str(fresh), step=4)["files"] == 3
    assert [s for s, _ in complete_checkpoints(fresh / "checkpoints")] == [4]
    # nothing in the store: the folder is emptied and stays so
    assert restore_step(storage, job_id=JOB, run_dir=str(run), step=None)["files"] == 0
    assert not (run / "checkpoints").exists()


def test_restore_removes_a_planted_link_and_never_writes_through_it(
        storage: ObjectStorage, run: Path, tmp_path: Path) -> None:
    src = tmp_path / "runs-a" / JOB
    src.mkdir(parents=True)
    _step(src, 2, {"__0_0.distcp": b"x"})
    upload_step(storage, job_id=JOB, run_dir=str(run.parent.parent / "runs-a" / JOB), step=2,
                keep=1)
    storage.write_marker(JOB, 2, {"step": 2})
    target = tmp_path / "host-dir"
    target.mkdir()
    (target / "keep.txt").write_text("host file")
    os.symlink(target, run / "checkpoints")  # the job's folder, a link to the host's files
    restore_step(storage, job_id=JOB, run_dir=str(run), step=2)
    assert (target / "keep.txt").read_text() == "host file"
    assert sorted(os.listdir(target)) == ["keep.txt"]
    assert not (run / "checkpoints").is_symlink()
    assert (run / "checkpoints" / "step_00000002" / "__0_0.distcp").read_bytes() == b"x"


def test_the_store_counts_marked_steps_prunes_and_copies(storage: ObjectStorage) -> None:
    fs = storage.filesystem()
    for step in (1, 2, 3, 4):
        with fs.open_output_stream(f"{storage.step_path(JOB, step)}/part") as f:
            f.write(b"p%d" % step)
        if step != 3:  # step 3's upload never finished: no marker
            storage.write_marker(JOB, step, {"step": step})
    assert storage.complete_steps(JOB) == [1, 2, 4]
    assert storage.prune(JOB, 2) == [2, 4]
    assert storage.complete_steps(JOB) == [2, 4]
    assert "step_00000001/part" not in keys(storage, JOB)
    assert storage.copy_step(JOB, 4, "job-new") == 2
    assert storage.complete_steps("job-new") == [4]
    assert keys(storage, "job-new") == ["step_00000004/COMPLETE", "step_00000004/part"]
    with pytest.raises(StorageError, match="keeps no complete checkpoint of step 3"):
        storage.copy_step(JOB, 3, "job-other")
    assert storage.complete_steps("job-other") == []


def test_an_object_name_meshyard_never_writes_is_refused_on_download(
        storage: ObjectStorage, run: Path) -> None:
    import boto3  # the S3 client of the server's own package: it writes any key

    client = boto3.client("s3", endpoint_url=storage.endpoint, region_name="us-east-1",
                          aws_access_key_id=storage.access_key,
                          aws_secret_access_key=storage.secret_key)
    prefix = storage.step_path(JOB, 5).split("/", 1)[1]
    client.put_object(Bucket=storage.bucket, Key=f"{prefix}/../../../../escape", Body=b"odd")
    storage.write_marker(JOB, 5, {"step": 5})
    with pytest.raises(TransferError, match="could not download the checkpoint of step 5"):
        restore_step(storage, job_id=JOB, run_dir=str(run), step=5)
    assert [s for s, _ in complete_checkpoints(run / "checkpoints")] == []
    assert not list(run.parents[1].rglob("escape*"))


def test_settings_name_what_is_wrong_with_the_store(s3, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="both set"):
        Settings(data_dir=tmp_path, checkpoint_uri="s3://meshyard/x",
                 checkpoint_storage=tmp_path).object_storage()
    with pytest.raises(StorageError, match=r"'Bad_Bucket' is not a bucket name"):
        Settings(data_dir=tmp_path, checkpoint_uri="s3://Bad_Bucket/x").object_storage()
    with pytest.raises(StorageError, match=r"the prefix part '\.\.' is not allowed"):
        Settings(data_dir=tmp_path, checkpoint_uri="s3://meshyard/a/../b").object_storage()
    missing = Settings(data_dir=tmp_path, checkpoint_uri="s3://no-such-bucket/x",
                       s3_endpoint=s3.endpoint, s3_access_key="meshyard-lab",
                       s3_secret_key="meshyard-lab-secret").object_storage()
    assert missing is not None and "secret" not in repr(missing)
    with pytest.raises(StorageError, match="'no-such-bucket' does not exist at http://127"):
        missing.check()
    closed = ObjectStorage.parse("s3://meshyard/x", endpoint="http://127.0.0.1:9",
                                 access_key="k", secret_key="s")
    with pytest.raises(StorageError, match=r"did not answer: .*MESHYARD_S3_ENDPOINT"):
        closed.check()


def _behind(storage: ObjectStorage, gate: Gate) -> ObjectStorage:
    """The same store, reached through `gate`."""
    return ObjectStorage.parse(storage.uri, endpoint=gate.endpoint,
                               access_key=storage.access_key, secret_key=storage.secret_key)


def test_a_store_that_is_down_is_told_apart_from_a_hosts_own_failure(
        storage: ObjectStorage, s3, run: Path, tmp_path: Path) -> None:
    """A download the store broke off is a StoreTransferError (asked again later); one this
    host's disk refused is a plain TransferError (it would fail the same way again)."""
    src = tmp_path / "runs-a" / JOB
    src.mkdir(parents=True)
    _step(src, 2, {"__0_0.distcp": b"y" * 100})
    upload_step(storage, job_id=JOB, run_dir=str(src), step=2, keep=1)
    storage.write_marker(JOB, 2, {"step": 2})
    gate = Gate((s3.host, s3.port))
    try:
        gated = _behind(storage, gate)
        gate.close()
        with pytest.raises(StoreTransferError, match="could not download the checkpoint of "
                           "step 2 on .*AWS Error"):
            restore_step(gated, job_id=JOB, run_dir=str(run), step=2)
        gate.open()
        assert restore_step(gated, job_id=JOB, run_dir=str(run), step=2)["files"] == 2
    finally:
        gate.stop()
    # this host's runs dir cannot hold the folder (a file where the runs dir goes)
    (tmp_path / "runs-b").write_text("a file, not a folder")
    with pytest.raises(TransferError, match="Not a directory") as err:
        restore_step(storage, job_id=JOB, run_dir=str(tmp_path / "runs-b" / JOB), step=2)
    assert not isinstance(err.value, StoreTransferError), err.value


def test_restore_asks_a_store_that_is_down_again_and_names_it_when_it_stays_down(
        storage: ObjectStorage, s3) -> None:
    from orchestrator.runtime.checkpoint_uploads import restore

    storage.write_marker(JOB, 8, {"step": 8})
    cfg = SimpleNamespace(job_id=JOB, run_dir="/nonexistent")
    gate = Gate((s3.host, s3.port))
    heard: list[str] = []
    try:
        gated = _behind(storage, gate)
        gate.close()
        t0 = time.monotonic()
        step, error, store_side = restore(cfg, gated, {}, wait_s=3.5, on_wait=heard.append)
        waited = time.monotonic() - t0
        assert (step, store_side) == (None, True) and error is not None
        assert error.startswith("the job's checkpoints could not be listed: the checkpoint "
                                f"store {storage.uri} ({gate.endpoint}) did not answer"), error
        # at least twice (the first try's client retries may outlast the wait on a loaded
        # host), 1 s apart
        asked = re.search(r"\(asked (\d+) times over 3.5 s\)$", error)
        assert asked and int(asked.group(1)) >= 2, error
        assert waited >= 1.0
        assert len(heard) == 1 and "asking again for up to 3.5 s" in heard[0], heard
        # back within the wait: the restore goes on as if nothing happened
        threading.Timer(1.5, gate.open).start()
        assert restore(cfg, gated, {}, wait_s=30) == (8, None, False)
    finally:
        gate.stop()


def test_the_gate_refuses_while_closed_and_keeps_its_port(s3) -> None:
    """The tests above take the store away with a Gate and bring it back on the same port;
    no other socket may take that port meanwhile (an "Address already in use" on `open()`
    once made a restore wait out its 30 s)."""
    import socket

    gate = Gate((s3.host, s3.port))
    try:
        gate.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", gate.port), timeout=5).close()
        other = socket.socket()
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="Address already in use"):
            other.bind(("127.0.0.1", gate.port))
        other.close()
        gate.open()
        socket.create_connection(("127.0.0.1", gate.port), timeout=5).close()
    finally:
        gate.stop()
    free = socket.socket()
    free.bind(("127.0.0.1", gate.port))  # given back
    free.close()
