"""Reading what a job wrote (orchestrator/isolation/runfiles.py): no link followed, no FIFO blocking the
reader, sizes bounded, pickles plain data only."""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path

import pytest

from orchestrator.isolation import runfiles
from orchestrator.watchdog import probe_files
from orchestrator.watchdog.flight_recorder import load_dump

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fr"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    (tmp_path / "secret").write_text("admin token")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank-0.stderr").write_text("line\n" * 10)
    return run


def test_a_link_anywhere_below_the_run_dir_is_refused(run: Path) -> None:
    (run / "logs" / "evil").symlink_to(run.parent / "secret")
    (run / "linked").symlink_to(run.parent)  # a directory link on the way
    for path in (run / "logs" / "evil", run / "linked" / "secret", "linked/secret"):
        with pytest.raises(runfiles.UnsafePath):
            runfiles.read_bytes(run, path, max_bytes=100)
    assert runfiles.read_json(run, run / "logs" / "evil") is None
    assert not runfiles.is_file(run, "linked/secret")
    assert runfiles.list_dir(run, "linked") == []
    with pytest.raises(runfiles.UnsafePath):
        runfiles.write_text(run, run / "logs" / "evil", "overwritten")
    assert (run.parent / "secret").read_text() == "admin token"


def test_paths_outside_the_run_dir_are_refused(run: Path) -> None:
    for path in (run.parent / "secret", run / ".." / "secret", "../secret", "/etc/passwd"):
        with pytest.raises(runfiles.UnsafePath):
            runfiles.read_bytes(run, path, max_bytes=100)


def test_a_fifo_does_not_block_the_reader(run: Path) -> None:
    os.mkfifo(run / "logs" / "pipe")
    done = threading.Event()

    def read() -> None:
        with pytest.raises(runfiles.UnsafePath):
            runfiles.read_bytes(run, "logs/pipe", max_bytes=100)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "reading a FIFO blocked"


def test_reads_are_bounded_and_tails_come_from_the_end(run: Path) -> None:
    assert runfiles.read_bytes(run, "logs/rank-0.stderr", max_bytes=7) == b"line\nli"
    assert runfiles.tail(run, "logs/rank-0.stderr", max_bytes=5) == b"line\n"
    (run / "big.json").write_text("[" + "1," * 1000 + "1]")
    assert runfiles.read_json(run, "big.json", max_bytes=100) is None
    assert len(runfiles.read_json(run, "big.json", max_bytes=10_000)) == 1001


def test_replace_text_replaces_a_link_it_finds_rather_than_writing_through_it(run: Path) -> None:
    (run / "logs" / "req").symlink_to(run.parent / "secret")
    runfiles.replace_text(run, "logs/req", "{}")
    assert (run / "logs" / "req").read_text() == "{}" and not (run / "logs" / "req").is_symlink()
    assert (run.parent / "secret").read_text() == "admin token"


class _Payload:
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, ("touch /nonexistent/pwned",))


def test_plain_loads_reads_data_and_refuses_every_class() -> None:
    data = {"entries": [{"seq": 1, "name": "gloo:all_reduce", "sizes": [(1, 2)]}],
            "pg_status": {"0": {"last_enqueued_collective": 3}}, "ok": True, "x": None,
            "s": {1, 2}, "f": frozenset({3}), "b": b"raw", "n": 1.5}
    for protocol in range(4, pickle.HIGHEST_PROTOCOL + 1):  # torch's dumps: 4 and 5
        assert runfiles.plain_loads(pickle.dumps(data, protocol=protocol)) == data, protocol
    for hostile in (pickle.dumps(_Payload()), pickle.dumps(Path("/x")),
                    pickle.dumps(threading.Event)):
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            runfiles.plain_loads(hostile)


def test_real_flight_recorder_dumps_are_plain_data() -> None:
    for path in sorted(FIXTURES.glob("*.pkl")):
        assert load_dump(path).entries, path


def test_a_probe_answer_cannot_name_its_own_artifacts(run: Path) -> None:
    out = run / "diagnostics" / "s1" / "rank0"
    out.mkdir(parents=True)
    (out / "fr_trace.pkl").write_bytes(pickle.dumps(_Payload()))
    (out / "stacks.txt").write_text("main")
    (out / "link").symlink_to(run.parent / "secret")
    info = {"id": "r", "artifacts": [str(run.parent / "secret")], "errors": []}
    summary = probe_files.rank_summary(info, rank=0, out=out, root=run,
                                       log_paths=[run / "logs" / "rank-0.stderr",
                                                  run.parent / "secret"])
    assert sorted(summary["artifacts"]) == sorted(
        str(out / n) for n in ("fr_trace.pkl", "stacks.txt", "nccl_debug_tail.log"))
    assert summary["fr_dump"] is None
    assert any("refused posix.system" in e for e in summary["errors"]), summary["errors"]
    assert "admin token" not in (out / "nccl_debug_tail.log").read_text()


def test_a_rank_written_native_dump_is_read_only_as_a_bounded_file_of_its_own(run: Path) -> None:
    from meshyard._protocol import PYSPY_FILE
    from orchestrator.watchdog.stacks import MAX_NATIVE_BYTES

    out = run / "diagnostics" / "s2" / "rank0"
    out.mkdir(parents=True)
    (out / PYSPY_FILE).symlink_to(run.parent / "secret")  # a link to the control plane's file
    summary = probe_files.rank_summary({"errors": []}, rank=0, out=out, root=run)
    assert "native" not in summary and "admin token" not in json.dumps(summary)

    (out / PYSPY_FILE).unlink()
    os.mkfifo(out / PYSPY_FILE)  # a FIFO would block a reader forever
    summary = probe_files.rank_summary({"errors": []}, rank=0, out=out, root=run)
    assert "native" not in summary

    (out / PYSPY_FILE).unlink()
    (out / PYSPY_FILE).write_bytes(b"\xff\xfe Thread 1 \x00" + b"x" * (4 * MAX_NATIVE_BYTES))
    native = probe_files.rank_summary({"errors": []}, rank=0, out=out, root=run)["native"]
    assert len(native.encode()) <= MAX_NATIVE_BYTES + 8 and native.startswith("\ufffd\ufffd")
