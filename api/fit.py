"""The service side of `meshyard.train`'s `TorchTrainer.fit()`: run in a child process of the
caller (`python -I -m api.fit REQUEST.json RESULT.json`), with the CLI's client and packaging.

REQUEST: {spec, working_dir, results_dir, verbose}. The service is the one MESHYARD_URL /
MESHYARD_TOKEN (or the data dir's server.json and admin.token) name, as for every CLI command;
when neither names one, an embedded `meshyard serve` on 127.0.0.1 (its data dir
`<results_dir>/service`), stopped at the end. Ships `working_dir`, submits `spec`, prints each
new log line of every rank as `(rank N) line`, waits for the end, and writes RESULT: {job_id,
state, message, failure_reason, metrics (rank 0's last report: every numeric key from the
service, text values too when the run dir is readable here), history, checkpoint (newest
complete, copied to `<results_dir>/checkpoint_<step>` when its files are readable here; its
`s3://` address on the cluster's checkpoint store),
path}. Ctrl-C cancels the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from api.client import (
    SERVER_FILE,
    TERMINAL,
    MeshyardAPIError,
    MeshyardClient,
    resolve_connection,
)

POLL_S = 0.5
SERVE_START_S = 180.0


def named_service(env: Mapping[str, str]) -> bool:
    """Whether the environment or the CLI's data dir names a service."""
    data_dir = Path(env.get("MESHYARD_DATA_DIR", ".meshyard"))
    return bool(env.get("MESHYARD_URL")) or (data_dir / SERVER_FILE).is_file()


@contextlib.contextmanager
def embedded_service(data_dir: Path) -> Iterator[tuple[str, str]]:
    """`meshyard serve` on a free port of 127.0.0.1 with its own Ray; (url, admin token)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / SERVER_FILE).unlink(missing_ok=True)
    token = secrets.token_urlsafe(24)
    env = {**os.environ, "MESHYARD_ADMIN_TOKEN": token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    log = data_dir / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()",
                                 "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir",
                                 str(data_dir), "--no-access-log"],
                                cwd=data_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = _wait_up(data_dir, proc, log)
        print(f"meshyard: embedded service at {url} (data dir {data_dir})", flush=True)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_up(data_dir: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + SERVE_START_S
    info = data_dir / SERVER_FILE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the embedded meshyard serve exited {proc.returncode}; its log: "
                               f"{log}")
        with contextlib.suppress(OSError, ValueError, KeyError, httpx.HTTPError):
            url = str(json.loads(info.read_text())["url"])
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return url
        time.sleep(0.2)
    raise RuntimeError(f"the embedded meshyard serve did not answer within {SERVE_START_S:.0f} s; "
                       f"its log: {log}")


def _stream_logs(client: MeshyardClient, job_id: str, after: int) -> int:
    page = client.logs(job_id, after=after, limit=1000)
    for x in page.items:
        who = f"rank {x.rank}" if x.rank is not None else "meshyard"
        print(f"({who}) {x.line}", flush=True)
        after = max(after, x.id)
    return after


def _last_reports(run_dir: Path, attempt: int) -> list[dict[str, Any]]:
    """Rank 0's reports of `attempt` as written, every key (text values too: the service
    stores numbers only), when its run dir is readable here."""
    path = run_dir / "logs" / f"attempt-{attempt}" / "rank-0.reports.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("kind") == "report":
                out.append(dict(rec.get("metrics") or {}))
    return out


def metrics_history(client: MeshyardClient, job_id: str) -> list[dict[str, Any]]:
    """Rank 0's rows from the service, step order, each with every numeric metric it
    reported (the fixed fields and `values`), paged through."""
    out: list[dict[str, Any]] = []
    after: int | None = None
    while True:
        page = client.metrics(job_id, rank=0, after_step=after).items
        for r in page:
            fixed = r.model_dump(exclude={"attempt", "rank", "time", "values"})
            out.append({**{k: v for k, v in fixed.items() if v is not None}, **r.values})
        if not page:
            return out
        after = page[-1].step


def follow(client: MeshyardClient, request: Mapping[str, Any], *,
           runs_dir: Path | None) -> dict[str, Any]:
    """Submits, streams, waits; the RESULT dict (see the module doc)."""
    submitted = client.submit_with_code(dict(request["spec"]),
                                        working_dir=Path(request["working_dir"]))
    job_id = submitted.id
    print(f"meshyard: job {job_id} submitted ({submitted.world_size} ranks) to "
          f"{client.base_url}", flush=True)
    after = 0
    try:
        while True:
            job = client.get_job(job_id)
            after = _stream_logs(client, job_id, after)
            if job.state.value in TERMINAL:
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        client.cancel(job_id)
        print(f"meshyard: cancelled {job_id}", flush=True)
        raise
    history = metrics_history(client, job_id)
    ckpts = [c for c in client.checkpoints(job_id).items if not c.removed]
    newest = max(ckpts, key=lambda c: (c.attempt, c.step)) if ckpts else None
    local = newest is not None and "://" not in newest.path  # not on object storage
    run_dir = (runs_dir / job_id) if runs_dir is not None else \
        (Path(newest.path).parents[1] if newest is not None and local else None)
    if run_dir is not None:
        reports = _last_reports(run_dir, job.current_attempt or 1)
        if reports and history:
            history[-1] = {**reports[-1], **history[-1]}
    results = Path(request["results_dir"])
    checkpoint, path = None, None
    if newest is not None:
        checkpoint = newest.path
        src = Path(newest.path)
        if local and src.is_dir():
            dest = results / f"checkpoint_{newest.step:06d}"
            shutil.copytree(src, dest, dirs_exist_ok=True)
            checkpoint, path = str(dest), str(results)
    return {"job_id": job_id, "state": job.state.value, "message": job.message,
            "failure_reason": job.failure_reason, "metrics": history[-1] if history else None,
            "history": history, "checkpoint": checkpoint, "path": path}


def run(request: Mapping[str, Any]) -> dict[str, Any]:
    if named_service(os.environ):
        conn = resolve_connection()
        with MeshyardClient(conn.url, conn.token) as client:
            return follow(client, request, runs_dir=None)
    data_dir = Path(request["results_dir"]) / "service"
    with embedded_service(data_dir) as (url, token), MeshyardClient(url, token) as client:
        return follow(client, request, runs_dir=data_dir / "runs")


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = run(request)
    except (MeshyardAPIError, ValueError, FileNotFoundError, RuntimeError) as exc:
        result = {"setup_error": f"meshyard could not run the job: {exc}"}
    except httpx.TransportError as exc:
        conn = resolve_connection()
        result = {"setup_error": f"cannot reach the meshyard service at {conn.url}: {exc} "
                  "(set MESHYARD_URL and MESHYARD_TOKEN, or unset MESHYARD_URL for an "
                  "embedded one)"}
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
