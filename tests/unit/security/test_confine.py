"""A confined rank process (meshyard/_confine.py), on this machine's real kernel, without Ray:
a forked child confines itself with a plan and tries what a hostile job would; the parent
holds the things it must not reach (a listening port, a hidden token, a process to signal).
Everything here runs as root in CI: root must be confined too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshyard import _confine, _landlock

pytestmark = pytest.mark.skipif(
    _landlock.abi() < _landlock.SCOPE_SINCE,
    reason=f"the kernel's Landlock is older than ABI {_landlock.SCOPE_SINCE} (Linux 6.12)")


def _in_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except OSError as exc:
        return type(exc).__name__
    return "reached"


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    hidden = tmp_path / "control-plane"
    (hidden / "runs" / "other").mkdir(parents=True)
    (hidden / "admin.token").write_text("msy_admin")
    (hidden / "runs" / "other" / "ckpt").write_bytes(b"other job")
    run = hidden / "runs" / "mine"
    (run / "tmp").mkdir(parents=True)
    data = hidden / "datasets"
    data.mkdir()
    (data / "corpus.txt").write_text("shared")
    return {"hidden": hidden, "run": run, "data": data}


def test_a_confined_root_process_reaches_nothing_outside_its_job(world: dict[str, Any]) -> None:
    hidden, run, data = world["hidden"], world["run"], world["data"]
    closed = socket.create_server(("127.0.0.1", 0))
    opened = socket.create_server(("127.0.0.1", 0))
    sleeper = subprocess.Popen(["sleep", "60"])
    ports = (closed.getsockname()[1],)
    plan = _confine.Plan(run_dir=str(run), tmp_dir=str(run / "tmp"), code_dirs=(str(data),),
                         hide=(str(hidden),), denied_ports=ports)

    def hostile() -> dict[str, Any]:
        _confine.apply(plan)
        caps = next(line.split()[1] for line in Path("/proc/self/status").read_text()
                    .splitlines() if line.startswith("CapEff"))
        return {
            "token": _outcome(lambda: open(hidden / "admin.token").read()),
            "other job": _outcome(lambda: open(hidden / "runs" / "other" / "ckpt").read()),
            "runs listed": sorted(os.listdir(hidden / "runs")),
            "closed port": _outcome(lambda: socket.create_connection(("127.0.0.1", ports[0]))),
            "open port": _outcome(lambda: socket.create_connection(
                ("127.0.0.1", opened.getsockname()[1]))),
            "bind ephemeral": _outcome(lambda: socket.socket().bind(("127.0.0.1", 0))),
            "bind closed": _outcome(lambda: socket.socket().bind(("127.0.0.1", ports[0]))),
            "signal": _outcome(lambda: os.kill(sleeper.pid, 9)),
            "environ": _outcome(lambda: open(f"/proc/{os.getppid()}/environ").read()),
            "processes": len([p for p in os.listdir("/proc") if p.isdigit()]),
            "caps": caps,
            "write /etc": _outcome(lambda: open("/etc/meshyard-confine-test", "w")),
            "write own": _outcome(lambda: (run / "out.bin").write_bytes(b"x")),
            "write data": _outcome(lambda: (data / "pwn").write_text("x")),
            "read data": _outcome(lambda: (data / "corpus.txt").read_text()),
            "link in run dir": _outcome(lambda: os.symlink("/etc/passwd", run / "l")),
            "fifo in run dir": _outcome(lambda: os.mkfifo(run / "f")),
            "write tmp": _outcome(lambda: Path("/tmp/x").write_text("x")),
            "unmount": _outcome(lambda: _unmount(str(hidden))),
            # undoing the reservation of the closed ports would break other jobs' listeners
            "unreserve ports": _outcome(lambda: Path(
                "/proc/sys/net/ipv4/ip_local_reserved_ports").write_text("\n")),
        }

    try:
        got = _in_child(hostile)
    finally:
        sleeper.kill()
        sleeper.wait()
        closed.close()
        opened.close()
    assert "error" not in got, got
    assert got["token"] == got["other job"] == "FileNotFoundError"
    assert got["runs listed"] == ["mine"]
    assert got["closed port"] == got["bind closed"] == "PermissionError"
    assert got["open port"] == got["bind ephemeral"] == "reached"
    assert got["signal"] == "PermissionError"
    assert got["environ"] == "FileNotFoundError"  # /proc shows no process outside the job
    assert got["processes"] == 1
    assert int(got["caps"], 16) == 0
    assert got["write /etc"] == got["link in run dir"] == got["fifo in run dir"] == \
        "PermissionError"
    assert got["write data"] in ("PermissionError", "OSError")  # read-only bind: EROFS
    assert got["write own"] == got["read data"] == got["write tmp"] == "reached"
    assert got["unmount"] == "PermissionError"
    assert got["unreserve ports"] == "PermissionError", got["unreserve ports"]
    assert (run / "tmp" / "x").read_text() == "x"  # the job's /tmp is its tmp dir
    assert not Path("/etc/meshyard-confine-test").exists()
    assert not (data / "pwn").exists()


def test_the_jobs_checkpoint_folder_on_shared_storage_is_its_only_one_there(
        world: dict[str, Any], tmp_path: Path) -> None:
    """The cluster's checkpoint storage holds every job's folder: the rank writes its own (a
    write_dirs entry), and the storage's other folders are hidden like the control plane."""
    storage = tmp_path / "storage"
    (storage / "job-other").mkdir(parents=True)
    (storage / "job-other" / "step_00000002").mkdir()
    (storage / "job-other" / "step_00000002" / "__0_0.distcp").write_bytes(b"other job")
    mine = storage / "job-mine"
    mine.mkdir()
    run = world["run"]
    plan = _confine.Plan(run_dir=str(run), tmp_dir=str(run / "tmp"),
                         hide=(str(world["hidden"]), str(storage)), write_dirs=(str(mine),))

    def hostile() -> dict[str, Any]:
        _confine.apply(plan)
        return {
            "write own": _outcome(lambda: (mine / "step_00000004").mkdir()
                                  or (mine / "step_00000004" / "x.distcp").write_bytes(b"x")),
            "read other": _outcome(lambda: (storage / "job-other" / "step_00000002"
                                            / "__0_0.distcp").read_bytes()),
            "listed": sorted(os.listdir(storage)),
            "write beside": _outcome(lambda: (storage / "job-other2").mkdir()),
            "link in own": _outcome(lambda: os.symlink("/etc/passwd", mine / "l")),
        }

    got = _in_child(hostile)
    assert "error" not in got, got
    assert got["write own"] == "reached"
    assert (mine / "step_00000004" / "x.distcp").read_bytes() == b"x"  # on the real storage
    assert got["read other"] == "FileNotFoundError"
    assert got["listed"] == ["job-mine"]
    assert got["link in own"] == "PermissionError"
    # a folder made beside it lands in the covering tmpfs (writable where the storage lies
    # under /tmp, as here), never on the storage
    assert got["write beside"] in ("reached", "PermissionError")
    assert not (storage / "job-other2").exists()


def _unmount(path: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(path.encode(), 2) != 0:
        raise PermissionError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


@pytest.mark.skipif(os.geteuid() != 0, reason="the test becomes another user to run as one")
def test_an_unprivileged_worker_confines_its_rank_through_a_user_namespace() -> None:
    """Workers that run as their own user (deploy/): the rank needs a user namespace for its
    mounts; everything else holds as for root."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="meshyard-unpriv-", dir="/tmp"))
    try:
        (root / "run" / "tmp").mkdir(parents=True)
        (root / "hidden").mkdir()
        (root / "hidden" / "token").write_text("msy_admin")
        for path in (root, *root.rglob("*")):
            path.chmod(0o777 if path.is_dir() else 0o666)
        closed = socket.create_server(("127.0.0.1", 0))
        port = closed.getsockname()[1]

        def unprivileged() -> dict[str, Any]:
            import ctypes

            os.setgid(65534)
            os.setuid(65534)
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again, as a fresh process is
            _confine.apply(_confine.Plan(run_dir=str(root / "run"),
                                         tmp_dir=str(root / "run" / "tmp"),
                                         hide=(str(root / "hidden"),), denied_ports=(port,)))
            sock = socket.socket()
            return {"uid": os.getuid(),
                    "token": _outcome(lambda: open(root / "hidden" / "token").read()),
                    "closed port": _outcome(lambda: sock.connect(("127.0.0.1", port))),
                    "write own": _outcome(lambda: (root / "run" / "x").write_text("x"))}

        got = _in_child(unprivileged)
        closed.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert got == {"uid": 65534, "token": "FileNotFoundError", "closed port": "PermissionError",
                   "write own": "reached"}, got


def test_a_threaded_process_is_refused_not_left_half_confined(world: dict[str, Any]) -> None:
    import threading

    def threaded() -> dict[str, Any]:
        threading.Thread(target=lambda: __import__("time").sleep(5), daemon=True).start()
        try:
            _confine.apply(_confine.Plan(run_dir=str(world["run"]),
                                         tmp_dir=str(world["run"] / "tmp")))
        except _confine.ConfineError as exc:
            return {"refused": str(exc)}
        return {"refused": None}

    assert "single-threaded" in (_in_child(threaded)["refused"] or "")


def test_the_host_self_test_passes_here(tmp_path: Path) -> None:
    assert _confine.self_test(str(tmp_path)) == []


def test_a_plan_round_trips_through_json() -> None:
    plan = _confine.Plan(run_dir="/r", tmp_dir="/r/tmp", shm_dir="/dev/shm/x",
                         code_dirs=("/c",), hide=("/h",), denied_ports=(1, 2))
    assert _confine.Plan.from_json(plan.to_json()) == plan


def test_an_old_kernel_is_named_before_the_self_test_runs() -> None:
    from orchestrator.isolation.modes import MIN_LANDLOCK_ABI, landlock_problem

    assert landlock_problem(MIN_LANDLOCK_ABI) is None
    assert "no Landlock" in str(landlock_problem(0))
    old = landlock_problem(MIN_LANDLOCK_ABI - 1)
    assert old is not None and f"ABI {MIN_LANDLOCK_ABI - 1}" in old and "6.12" in old


CLOSED = (40001, 40003, 40005, 40007, 40009)


def _listen_in_own_netns(*, reserve: bool) -> dict[str, Any]:
    """In a fresh network namespace whose ephemeral range is 40000-40009, with its odd ports
    (those the kernel tries first for port 0) closed by the TCP layer: two listeners bound to
    port 0, each then connected to."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:  # CLONE_NEWNET
        return {"error": f"unshare: {os.strerror(ctypes.get_errno())}"}
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write("40000 40009")
    _confine.port_ruleset(CLOSED, reserve=reserve).restrict()
    with open("/proc/sys/net/ipv4/ip_local_reserved_ports") as f:
        reserved = f.read().strip()
    out: dict[str, Any] = {"reserved": reserved, "listeners": []}
    servers = [socket.socket() for _ in range(2)]  # both held open to the end
    for server in servers:
        try:
            server.bind(("127.0.0.1", 0))
        except OSError as exc:
            out["listeners"].append([None, type(exc).__name__])
            continue
        server.listen()
        port = server.getsockname()[1]
        out["listeners"].append([port, _outcome(
            lambda p=port: socket.create_connection(("127.0.0.1", p), timeout=2).close())])
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of its own needs root")
def test_a_listener_on_port_zero_never_gets_a_closed_port() -> None:
    # gloo and NCCL listen on port 0. Without the reservation the kernel hands out the closed
    # port, and every peer's connect to that listener is refused by the TCP layer.
    open_range = _in_child(lambda: _listen_in_own_netns(reserve=False))
    assert "error" not in open_range, open_range
    assert open_range["reserved"] == ""
    assert [(p in CLOSED, outcome) for p, outcome in open_range["listeners"]] == \
        [(True, "PermissionError")] * 2
    reserved = _in_child(lambda: _listen_in_own_netns(reserve=True))
    assert "error" not in reserved, reserved
    assert reserved["reserved"] == "40001,40003,40005,40007,40009"
    assert [(p in CLOSED, outcome) for p, outcome in reserved["listeners"]] == \
        [(False, "reached")] * 2


def test_reserved_port_lists_are_read_and_written_in_the_sysctl_format() -> None:
    assert _confine._parse_ports("1,5-7, 9\n") == {1, 5, 6, 7, 9}
    assert _confine._parse_ports("") == set()
    assert _confine._format_ports({9, 1, 5, 6, 7}) == "1,5-7,9"
    assert _confine._format_ports([]) == ""
