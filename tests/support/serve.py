"""A real `meshyard serve` subprocess for tests: start it, find its URL, stop it (used by
tests/integration/runtime and tests/security/hostile)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def start_serve(data_dir: Path, *, token: str, address: str | None = None,
                cluster_file: Path | None = None,
                extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """A real `meshyard serve` subprocess on a free port, in its own session (its process
    group is it and what it started). Joined to the Ray cluster at `address`, or with
    `address` None on its embedded defaults: its own local Ray and none of this process's
    MESHYARD_* / RAY_* settings. Its warm pool is the default one, without the prestarted
    user-code rank process: the callers run built-in jobs only, so those processes (each
    importing torch) would never be used."""
    data_dir.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "meshyard"
    env = {k: v for k, v in os.environ.items()
           if address is not None or not k.startswith(("MESHYARD_", "RAY_"))}
    env.update(MESHYARD_ADMIN_TOKEN=token, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               MESHYARD_WARM_POOL_USER_CODE="0")
    args = [str(exe), "serve", "--port", "0", "--data-dir", str(data_dir), "--no-access-log"]
    if address is not None:
        args += ["--ray-address", address]
    if cluster_file is not None:
        args += ["--cluster-file", str(cluster_file)]
    log = open(data_dir / "serve.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([*args, *extra], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_serve(proc: subprocess.Popen[bytes], *, timeout_s: float = 30) -> None:
    """SIGTERM (graceful shutdown), then SIGKILL if it has not exited within `timeout_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def serve_url(data_dir: Path, proc: subprocess.Popen[bytes], *, token: str | None = None,
              timeout_s: float = 60) -> str:
    """The URL `proc` wrote to server.json; with `token`, also waits until it answers."""
    from api.client import MeshyardClient

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, (data_dir / "serve.log").read_text()[-3000:]
        try:
            info = json.loads((data_dir / "server.json").read_text())
            if info["pid"] == proc.pid:
                if token is None:
                    return str(info["url"])
                with MeshyardClient(str(info["url"]), token) as client:
                    if client.healthy():  # listening once the runtime has started
                        return str(info["url"])
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("server did not start: " + (data_dir / "serve.log").read_text()[-3000:])
