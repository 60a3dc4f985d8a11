"""The fork server's protocol, without Ray: the client is run as Ray runs it (its first
argument a `default_worker.py`, `--temp-dir=` among the rest), with a stand-in worker script
that reports what it sees. One server is started for the module (its temp dir) and serves
every test; the idle test starts its own."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import gone
from workers.host import forkserver_client as client

WORKER = r'''
import json, os, signal, sys, time
mode = os.environ.get("MODE", "report")
if mode == "report":
    import numpy
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
        "path": sys.path[:3], "env": dict(os.environ),
        "torch": "torch" in sys.modules, "name": __name__,
        "random": numpy.random.randint(0, 2**31), "threads": len(os.listdir("/proc/self/task")),
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "sid": os.getsid(0) == os.getpid(),
    }), flush=True)
elif mode == "exit":
    sys.exit(int(os.environ["CODE"]))
elif mode == "raise":
    raise RuntimeError("boom from the worker")
elif mode == "term":
    def on_term(sig, frame):  # os.write: the signal may come inside print's flush below
        os.write(1, b"got SIGTERM\n")
        sys.exit(3)
    signal.signal(signal.SIGTERM, on_term)
    print(os.getpid(), flush=True)
    # Short sleeps: a signal that lands after print's write but before one long sleep
    # starts would run its Python handler only when that sleep ends (CPython checks for
    # signals between bytecodes), which reads as a signal never forwarded.
    for _ in range(600):
        time.sleep(0.1)
elif mode == "sleep":
    print(os.getpid(), flush=True)
    time.sleep(60)
elif mode == "selfkill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "rank":  # the rank process forked with this worker: report it, then use it
    from pathlib import Path
    from meshyard import _prestart
    info = _prestart.PREFORKED
    print(json.dumps({"worker": os.getpid(), "rank": info[0] if info else None}), flush=True)
    sys.stdin.readline()  # the test looks at the waiting process first
    from workers.host.rankproc import PrestartedRank
    pre = PrestartedRank.preforked()
    ready = pre.wait_ready(timeout_s=60)
    d = os.environ["OUT_DIR"]
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", "RANK_SAYS": "hi"}
    argv = [sys.executable, "-m", "meshyard.runner", "script", os.path.join(d, "user.py"), "x"]
    proc = pre.hand(argv, env=env, cwd=d, stdout=Path(d, "out"), stderr=Path(d, "err"))
    rc = proc.wait(60) if proc is not None else None
    print(json.dumps({"ready": ready, "handed": proc is not None, "rc": rc,
                      "again": PrestartedRank.preforked() is None}), flush=True)
'''


@pytest.fixture(scope="module")
def temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("fs")
    if len(client.socket_path(str(d), python=sys.executable)) > client.MAX_SOCKET_PATH:
        d = Path(os.path.realpath("/tmp")) / f"meshyard-fs-{os.getpid()}"
        d.mkdir(exist_ok=True)
    yield d
    _stop_server(d)


def _server_pid(temp_dir: Path) -> int | None:
    sock = client.socket_path(str(temp_dir), python=sys.executable)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"workers.host.forkserver" in cmd and sock.encode() in cmd:
            return int(pid)
    return None


def _stop_server(temp_dir: Path) -> None:
    pid = _server_pid(temp_dir)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)


def _signal_state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "gone"
    keep = ("State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    return "; ".join([x for x in status if x.startswith(keep)] + [f"wchan {wchan}"])


def _worker_dir(tmp_path: Path) -> Path:
    d = tmp_path / "workers"
    d.mkdir(exist_ok=True)
    (d / "default_worker.py").write_text(WORKER)
    return d


def _start(tmp_path: Path, temp_dir: Path, *, env: dict[str, str] | None = None,
           cwd: Path | None = None, args: tuple[str, ...] = (),
           stdin: int | None = None) -> subprocess.Popen[str]:
    script = _worker_dir(tmp_path) / "default_worker.py"
    full = {"PATH": os.environ["PATH"], "HOME": "/root", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(client.__file__), str(script),
         f"--temp-dir={temp_dir}", *args],
        env=full, cwd=cwd or tmp_path, stdin=stdin, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def test_a_worker_is_forked_with_the_clients_environment_streams_and_arguments(
        tmp_path: Path, temp_dir: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    first = _start(tmp_path, temp_dir, cwd=code, args=("--worker-id=abc",),
                   env={"MODE": "report", "ONLY_MINE": "x y", "PYTHONPATH": str(code)})
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    got = json.loads(out)
    server = _server_pid(temp_dir)
    assert server is not None and got["ppid"] == server  # forked, not started
    assert got["torch"] is True  # imported by the server, not by the worker
    assert got["name"] == "__main__"
    assert got["argv"][1:] == [f"--temp-dir={temp_dir}", "--worker-id=abc"]
    assert got["argv"][0].endswith("workers/default_worker.py")
    assert got["cwd"] == str(code)
    # sys.path as `python default_worker.py` builds it: the script's dir, then PYTHONPATH
    assert got["path"][:2] == [os.path.dirname(got["argv"][0]), str(code)]
    # the whole environment is the client's: nothing of the server's start-up one is added
    assert got["env"]["ONLY_MINE"] == "x y"
    assert "OPENBLAS_NUM_THREADS" not in got["env"]
    assert set(got["env"]) - {"PATH", "HOME", "MODE", "ONLY_MINE", "PYTHONPATH", "LC_CTYPE"} \
        == set(), got["env"]
    assert got["fds"] == [0, 1, 2, 3], "the server's socket and pidfds are not inherited"
    assert got["threads"] == 1
    assert got["sid"] is True
    # a second worker: a fresh numpy random state, the same server
    second = _start(tmp_path, temp_dir, env={"MODE": "report"})
    out2, err2 = second.communicate(timeout=120)
    assert second.returncode == 0, err2
    got2 = json.loads(out2)
    assert got2["ppid"] == server and got2["pid"] != got["pid"]
    assert got2["random"] != got["random"]


def test_the_client_exits_as_its_worker_did(tmp_path: Path, temp_dir: Path) -> None:
    p = _start(tmp_path, temp_dir, env={"MODE": "exit", "CODE": "7"})
    assert p.wait(timeout=120) == 7
    p = _start(tmp_path, temp_dir,
               env={"MODE": "raise"})
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1
    assert "RuntimeError: boom from the worker" in err  # the traceback on the client's stderr
    p = _start(tmp_path, temp_dir,
               env={"MODE": "selfkill"})
    assert p.wait(timeout=120) == -signal.SIGKILL


def test_signals_reach_the_worker_and_a_killed_client_takes_it_along(
        tmp_path: Path, temp_dir: Path) -> None:
    p = _start(tmp_path, temp_dir, env={"MODE": "term"})
    assert p.stdout is not None
    worker = int(p.stdout.readline())
    assert worker != p.pid
    p.send_signal(signal.SIGTERM)  # Ray's graceful kill goes to the process it started
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # which side lost it: a signal pending in the worker, or never sent by the client
        raise AssertionError({pid: _signal_state(pid) for pid in (p.pid, worker)}) from None
    assert "got SIGTERM" in out and p.returncode == 3, (p.returncode, err)
    assert gone([worker])

    q = _start(tmp_path, temp_dir,
               env={"MODE": "sleep"})
    assert q.stdout is not None
    worker = int(q.stdout.readline())
    server = _server_pid(temp_dir)
    q.kill()  # SIGKILL: nothing to forward; the server sees the connection close
    q.wait(timeout=30)
    assert gone([worker]), "the worker of a killed client lives on"
    r = _start(tmp_path, temp_dir, env={"MODE": "exit", "CODE": "5"})
    assert r.wait(timeout=120) == 5
    assert _server_pid(temp_dir) == server  # the same server, after both events


def test_the_server_refuses_anything_but_a_ray_worker(tmp_path: Path, temp_dir: Path) -> None:
    p = _start(tmp_path, temp_dir, env={"MODE": "exit", "CODE": "0"})  # the server is up
    assert p.wait(timeout=120) == 0
    path = client.socket_path(str(temp_dir), python=sys.executable)
    evil = tmp_path / "evil.py"
    evil.write_text("open('/tmp/pwned', 'w')")
    def message(head: object, env: object = None) -> bytes:
        return json.dumps(head).encode() + b"\n" + json.dumps(env or {}).encode()

    for req, fds in ((b"not json\n{}", [0, 1, 2]),
                     (message({"argv": [str(evil)], "cwd": "/"}), [0, 1, 2]),
                     (message({"argv": ["/x/default_worker.py"], "cwd": "/"}), [0]),
                     (message({"argv": ["/x/default_worker.py"], "cwd": "/", "rank": "yes"}),
                      [0, 1, 2]),
                     # the whole request on one line: the server reads no environment
                     (json.dumps({"argv": ["/x/default_worker.py"], "cwd": "/", "env": {}})
                      .encode(), [0, 1, 2])):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(path)
            import array

            s.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            reply = json.loads(s.recv(1 << 16))
        assert "pid" not in reply and reply["error"]
    assert _server_pid(temp_dir) is not None  # and it still serves


def test_without_a_server_the_client_starts_the_worker_itself(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)  # a socket path longer than sun_path
    deep.mkdir()
    p = _start(tmp_path, deep, env={"MODE": "report"})
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "no fork server (socket path longer than 107 bytes" in err
    got = json.loads(out)
    assert got["pid"] == p.pid and got["torch"] is False  # exec'd in place, cold


def test_an_idle_server_exits_and_removes_its_socket(tmp_path: Path) -> None:
    temp = Path(os.path.realpath("/tmp")) / f"meshyard-fs-idle-{os.getpid()}"
    temp.mkdir(exist_ok=True)
    try:
        p = _start(tmp_path, temp, env={"MODE": "exit", "CODE": "0",
                                        client.IDLE_VAR: "1"})
        assert p.wait(timeout=120) == 0
        server = _server_pid(temp)
        assert server is not None
        assert gone([server])
        assert not Path(client.socket_path(str(temp), python=sys.executable)).exists()
    finally:
        _stop_server(temp)
        for f in temp.iterdir():
            f.unlink()
        temp.rmdir()


def test_the_runtime_env_names_the_client_only_when_forking() -> None:
    from workers.host.forkserver import runtime_env

    assert runtime_env({"working_dir": "gcs://x.zip"}, fork=False) == \
        {"working_dir": "gcs://x.zip"}
    env = runtime_env({"working_dir": "gcs://x.zip"})
    assert env["working_dir"] == "gcs://x.zip"
    assert shlex.split(env["py_executable"]) == [sys.executable, "-I", "-S", client.__file__]


USER_SCRIPT = r'''
import atexit, json, os, sys, threading, time
def late():
    time.sleep(0.3)
    open("thread-joined", "w").close()
threading.Thread(target=late).start()  # not a daemon: the process waits for it
atexit.register(lambda: open("atexit-ran", "w").close())
print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0) == os.getpid(),
    "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ),
    "torch": "torch" in sys.modules,
    "control_plane": sorted(m for m in sys.modules
                            if m.partition(".")[0] in ("workers", "orchestrator", "api")),
    "write_through": sys.stdout.write_through,
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
}))
sys.exit(7)
'''


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable writable mapping of `pid` holds `needle` (root reads
    /proc/PID/mem)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5] in (
                    "[vvar]", "[vsyscall]", "[vdso]")):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    return True
            except OSError:
                continue
    return False


def test_a_rank_process_forked_with_the_worker_holds_no_secret_and_becomes_the_rank(
        tmp_path: Path, temp_dir: Path) -> None:
    """MESHYARD_FORK_RANK=1: the worker gets a child forked before it read its environment,
    which holds nothing of any request (the server never parses one; both copies of the
    buffer are zeroed), waits in its own session, and becomes the user's rank as a
    prestarted process would: the rank's environment only, unbuffered streams, no fork
    server module, its threads joined and atexit run before it exits with the script's
    status."""
    secret = f"tok-{os.urandom(12).hex()}"
    out = tmp_path / "rank"
    out.mkdir()
    (out / "user.py").write_text(USER_SCRIPT)
    p = _start(tmp_path, temp_dir, stdin=subprocess.PIPE,
               env={"MODE": "rank", client.RANK_VAR: "1", "RAY_AUTH_TOKEN": secret,
                    "OUT_DIR": str(out), "PYTHONPATH": str(Path(__file__).parents[3])})
    try:
        assert p.stdout is not None and p.stdin is not None
        first = json.loads(p.stdout.readline() or "{}")
        worker, rank = first.get("worker"), first.get("rank")
        assert rank is not None, (first, p.stderr.read() if p.poll() is not None else "")
        # Its set-up done (the last step before it waits for the actor: its command line)
        expected = [sys.executable.encode(), b"-m", b"meshyard._prestart"]
        deadline = time.monotonic() + 60
        while (shown := Path(f"/proc/{rank}/cmdline").read_bytes().rstrip(b"\0")
               .split(b"\0")) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shown == expected
        status = dict(line.split(":\t", 1) for line in
                      Path(f"/proc/{rank}/status").read_text().splitlines() if ":\t" in line)
        assert int(status["PPid"]) == worker
        assert os.getsid(rank) == rank
        assert sorted(int(f) for f in os.listdir(f"/proc/{rank}/fd")) == [0, 1, 2]
        assert secret.encode() not in Path(f"/proc/{rank}/environ").read_bytes()
        assert _memory_holds(worker, secret.encode())  # the check can see one
        assert not _memory_holds(rank, secret.encode())
        p.stdin.write("go\n")
        p.stdin.flush()
        done = json.loads(p.stdout.readline() or "{}")
        assert done == {"ready": True, "handed": True, "rc": 7, "again": True}, \
            (done, (out / "err").read_text() if (out / "err").exists() else "")
    finally:
        p.kill()
        p.wait(timeout=60)
    got = json.loads((out / "out").read_text())
    assert got["pid"] == rank and got["ppid"] == worker and got["sid"]
    assert got["name"] == "__main__" and got["argv"] == [str(out / "user.py"), "x"]
    assert got["cwd"] == str(out) and got["env"]["RANK_SAYS"] == "hi"
    assert "RAY_AUTH_TOKEN" not in got["env"] and "OUT_DIR" not in got["env"]
    assert got["torch"] and got["control_plane"] == [] and got["write_through"]
    assert got["fds"][:3] == [0, 1, 2]
    assert (out / "thread-joined").exists() and (out / "atexit-ran").exists()
