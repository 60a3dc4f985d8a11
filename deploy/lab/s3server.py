"""An S3-compatible server for the lab and the tests: moto's server (`moto_server`, a real
process speaking the S3 protocol over HTTP), one bucket made in it, stopped by its PID.

`start` binds it to `host` on a free port (the port it printed is read back), waits until
it answers, and creates `bucket`; the lab runs it in its control plane's host, where it
listens on the lab network (deploy/lab/jobs.py). Nothing here is used by the service itself:
meshyard speaks to any S3-compatible store (orchestrator/runtime/object_storage.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "meshyard-lab"
SECRET_KEY = "meshyard-lab-secret"
_LISTENING = re.compile(rb"Running on http://[^:\s]+:(\d+)")


@dataclass
class S3Server:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    bucket: str
    log: Path

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def uri(self, prefix: str = "checkpoints") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def env(self, prefix: str = "checkpoints") -> dict[str, str]:
        """The control plane's settings for this store."""
        return {"MESHYARD_CHECKPOINT_URI": self.uri(prefix), "MESHYARD_S3_ENDPOINT": self.endpoint,
                "MESHYARD_S3_ACCESS_KEY": ACCESS_KEY, "MESHYARD_S3_SECRET_KEY": SECRET_KEY}

    def stop(self) -> None:
        """Ends the server (its own process group) by its PID."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start(host: str, *, log: Path, bucket: str = "meshyard",
          spawn: Callable[[list[str]], subprocess.Popen[bytes]] | None = None,
          run_python: Callable[[str], None] | None = None,
          timeout_s: float = 60.0) -> S3Server:
    """The server on `host`, a free port, with `bucket` made. `spawn` starts its argv
    elsewhere (the lab: in a host, its output appended to `log`), and `run_python` runs the
    bucket's creation there; by default both happen here."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        raise RuntimeError(f"{exe} is missing: install the dev extra (moto[server])")
    argv = [str(exe), "-H", host, "-p", "0"]
    seen = log.stat().st_size if log.exists() else 0
    if spawn is None:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    else:
        proc = spawn(argv)
    server = None
    try:
        deadline = time.monotonic() + timeout_s
        while server is None:
            found = _LISTENING.search(log.read_bytes()[seen:])
            if found:
                server = S3Server(proc=proc, host=host, port=int(found.group(1)),
                                  bucket=bucket, log=log)
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
            else:
                time.sleep(0.1)
        code = _BUCKET_CODE.format(endpoint=f"{host}:{server.port}", bucket=bucket,
                                   key=ACCESS_KEY, secret=SECRET_KEY, timeout_s=timeout_s)
        if run_python is None:
            exec(compile(code, "make-bucket", "exec"), {})  # noqa: S102 - our own constant
        else:
            run_python(code)
        return server
    except BaseException:
        (server or S3Server(proc, host, 0, bucket, log)).stop()
        raise


_BUCKET_CODE = """
import time
from pyarrow import fs as pafs
s3 = pafs.S3FileSystem(access_key={key!r}, secret_key={secret!r}, scheme="http",
                       endpoint_override={endpoint!r}, region="us-east-1",
                       allow_bucket_creation=True, connect_timeout=2, request_timeout=5)
deadline = time.monotonic() + {timeout_s}
while True:
    try:
        s3.create_dir({bucket!r})
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
"""
