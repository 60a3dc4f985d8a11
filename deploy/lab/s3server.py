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
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def uri(self, prefix: str = "checkpoints") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def env(self, prefix: str = "checkpoints") -> dict[str, str]:
        """The control plane's settings for this store."""
        return {"MESHYARD_CHECKPOINT_URI": self.uri(prefix), "MESHYARD_S3_ENDPOINT": self.endpoint,
                "MESHYARD_S3_ACCESS_KEY": self.access_key,
                "MESHYARD_S3_SECRET_KEY": self.secret_key}

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
          timeout_s: float = 60.0, authenticated: bool = False) -> S3Server:
    """The server on `host`, a free port, with `bucket` made. `spawn` starts its argv
    elsewhere (the lab: in a host, its output appended to `log`), and `run_python` runs the
    bucket's creation there; by default both happen here.

    `authenticated` (here only): the server then refuses every request not signed with the
    keys it made for one user allowed s3:* (`access_key` / `secret_key`), as a real store
    does; by default it takes any keys."""
    if authenticated and (spawn is not None or run_python is not None):
        raise ValueError("an authenticated store is started on this host only")
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
        if authenticated:
            server.access_key, server.secret_key = _require_keys(server.endpoint)
        return server
    except BaseException:
        (server or S3Server(proc, host, 0, bucket, log)).stop()
        raise


def _require_keys(endpoint: str) -> tuple[str, str]:
    """One IAM user allowed s3:*, its new keys; then moto checks every request's signature
    (its /moto-api/reset-auth: no unauthenticated request left)."""
    import json
    import urllib.request

    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    iam.create_user(UserName="meshyard")
    iam.put_user_policy(UserName="meshyard", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*",
                                                 "Resource": "*"}]}))
    key = iam.create_access_key(UserName="meshyard")["AccessKey"]
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
    return key["AccessKeyId"], key["SecretAccessKey"]


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
