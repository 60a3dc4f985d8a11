"""API benchmark: submissions/s and read latency with 10,000 jobs, SQLite and PostgreSQL.

    .venv/bin/python bench/api.py                       # SQLite (+ PostgreSQL when
    MESHYARD_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python bench/api.py --jobs 10000      #   the URL is set)

Starts `meshyard serve` (one uvicorn worker, access log off, no scheduler) in its own process
on a fresh data dir / fresh PostgreSQL database, submits --jobs jobs through POST /v1/jobs from
--concurrency client threads (keep-alive connections), then times --samples sequential
GET /v1/jobs/{id} (random ids) and GET /v1/jobs?limit=50 (random pages), interleaved with
GET /healthz as the floor (uvicorn + FastAPI with no auth and no database). Latency is
measured at the client (stdlib http.client, to keep client overhead small); the server's CPU
per request is read from /proc over 500 more requests of each kind. Writes
bench/results/api.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.postgres: the scratch PostgreSQL database helper
RESULTS = REPO / "bench" / "results" / "api.json"
SPEC = {"name": "bench", "parallelism": {"dp_replicate": 2}, "training": {"steps": 10}}


class Conn:
    """One keep-alive HTTP/1.1 connection with the bearer token."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.http = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.http.request(method, path, body=body, headers=self.headers)
        response = self.http.getresponse()
        return response.status, response.read()


@contextmanager
def server(*, data_dir: Path, database_url: str | None) -> Iterator[tuple[str, str, int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHYARD_")}
    args = [sys.executable, "-c", "from api.cli import main; main()", "serve", "--port", "0",
            "--data-dir", str(data_dir), "--no-scheduler", "--no-access-log"]
    if database_url:
        args += ["--database-url", database_url]
    log = (data_dir.parent / "server.log").open("w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; see {log.name}")
            try:
                info = json.loads((data_dir / "server.json").read_text())
                token = (data_dir / "admin.token").read_text().strip()
                conn = Conn(info["url"], token)
                if conn.request("GET", "/readyz")[0] == 200:
                    break
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
        yield info["url"], token, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux), to report server CPU per request: a figure the
    machine's other load distorts much less than latency."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server_cpu(pid: int, result: dict[str, Any], *, requests: int) -> Iterator[None]:
    start = cpu_seconds(pid)
    yield
    result["server_cpu_ms_per_request"] = round((cpu_seconds(pid) - start) * 1000 / requests, 2)


def submit_all(url: str, token: str, *, jobs: int, concurrency: int) -> dict[str, Any]:
    body = json.dumps(SPEC).encode()
    ids: list[str] = []
    errors: list[int] = []
    lock = threading.Lock()
    per_thread = [jobs // concurrency + (1 if i < jobs % concurrency else 0)
                  for i in range(concurrency)]

    def worker(n: int) -> None:
        conn = Conn(url, token)
        for _ in range(n):
            status, data = conn.request("POST", "/v1/jobs", body)
            with lock:
                if status == 201:
                    ids.append(json.loads(data)["id"])
                else:
                    errors.append(status)

    threads = [threading.Thread(target=worker, args=(n,)) for n in per_thread]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {"jobs": len(ids), "errors": len(errors), "seconds": round(elapsed, 2),
            "submissions_per_s": round(len(ids) / elapsed, 1), "ids": ids}


def _summary(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {"n": len(samples), "p50_ms": round(statistics.median(samples), 2),
            "p99_ms": round(samples[int(0.99 * (len(samples) - 1))], 2),
            "mean_ms": round(statistics.fmean(samples), 2)}


def timed_get(conn: Conn, path: str) -> float:
    start = time.perf_counter()
    status, _ = conn.request("GET", path)
    if status != 200:
        raise RuntimeError(f"GET {path} -> {status}")
    return (time.perf_counter() - start) * 1000


def interleaved_latency(conn: Conn, kinds: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """One request of each kind per round, so every kind sees the same bursts of load from
    the rest of the machine; the floor's p99 then shows how much of a p99 is the machine."""
    for paths in kinds.values():  # warm-up: connection, caches, code paths
        for path in paths[:50]:
            conn.request("GET", path)
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(min(len(p) for p in kinds.values())):
        for kind, paths in kinds.items():
            samples[kind].append(timed_get(conn, paths[i]))
    return {k: _summary(v) for k, v in samples.items()}


def cpu_per_request(conn: Conn, pid: int, paths: list[str]) -> float:
    start = cpu_seconds(pid)
    for path in paths:
        conn.request("GET", path)
    return round((cpu_seconds(pid) - start) * 1000 / len(paths), 2)


def list_pages(conn: Conn, n: int) -> list[str]:
    """Paths of real pages: the first, and pages reached through next_cursor."""
    paths, cursor = ["/v1/jobs?limit=50"], None
    while len(paths) < 200:
        query = {"limit": 50, **({"cursor": cursor} if cursor else {})}
        _, data = conn.request("GET", "/v1/jobs?" + urlencode(query))
        cursor = json.loads(data)["next_cursor"]
        if not cursor:
            break
        paths.append("/v1/jobs?" + urlencode({"limit": 50, "cursor": cursor}))
    return [random.choice(paths) for _ in range(n)]


def measure(url: str, token: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    cpu: dict[str, Any] = {}
    with server_cpu(pid, cpu, requests=args.jobs):
        sub = submit_all(url, token, jobs=args.jobs, concurrency=args.concurrency)
    sub.update(cpu)
    ids = sub.pop("ids")
    conn = Conn(url, token)
    kinds = {"get_job": [f"/v1/jobs/{random.choice(ids)}" for _ in range(args.samples)],
             "list_jobs_limit_50": list_pages(conn, args.samples),
             # the floor: same server and connection, no auth, no database
             "healthz_floor": ["/healthz"] * args.samples}
    reads = interleaved_latency(conn, kinds)
    for kind, paths in kinds.items():
        reads[kind]["server_cpu_ms_per_request"] = cpu_per_request(conn, pid, paths[:500])
    floor = reads["healthz_floor"]["p50_ms"]
    return {"submit": sub, **reads, "p50_ratio_vs_floor": {
        k: round(reads[k]["p50_ms"] / floor, 2) for k in ("get_job", "list_jobs_limit_50")}}


def run_backend(name: str, *, database_url: str | None, args: argparse.Namespace
                ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"meshyard-bench-{name}-") as tmp, \
            server(data_dir=Path(tmp) / "data", database_url=database_url) as (url, token, pid):
        result = {"backend": name, **measure(url, token, pid, args)}
    print(json.dumps(result), flush=True)
    return result


@contextmanager
def postgres_database(base: str) -> Iterator[str]:
    from tests.postgres import scratch_postgres_database

    with scratch_postgres_database(base, prefix="meshyard_bench_") as url:
        yield url


def uvicorn_stack() -> dict[str, str]:
    """Which HTTP parser and event loop uvicorn picks here: they change the figures several
    fold (h11 + asyncio vs httptools + uvloop, i.e. `uvicorn[standard]`)."""
    from importlib.util import find_spec

    return {"http": "httptools" if find_spec("httptools") else "h11",
            "loop": "uvloop" if find_spec("uvloop") else "asyncio"}


def markdown(results: list[dict[str, Any]]) -> str:
    """The table bench/README.md shows."""
    lines = ["| backend | submissions/s | GET /v1/jobs/{id} p50 / p99 | GET /v1/jobs?limit=50 "
             "p50 / p99 | /healthz floor p50 | server CPU per submit / get / list |",
             "|---|---|---|---|---|---|"]
    for r in results:
        s, g, li, f = r["submit"], r["get_job"], r["list_jobs_limit_50"], r["healthz_floor"]
        lines.append(f"| {r['backend']} | {s['submissions_per_s']:.0f} | {g['p50_ms']} / "
                     f"{g['p99_ms']} ms | {li['p50_ms']} / {li['p99_ms']} ms | {f['p50_ms']} ms "
                     f"| {s['server_cpu_ms_per_request']} / {g['server_cpu_ms_per_request']} / "
                     f"{li['server_cpu_ms_per_request']} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = []
    load_at_start = os.getloadavg()[0]
    backends = args.backends.split(",")
    if "sqlite" in backends:
        results.append(run_backend("sqlite", database_url=None, args=args))
    pg = os.environ.get("MESHYARD_TEST_POSTGRES_URL")
    if "postgres" in backends and pg:
        with postgres_database(pg) as url:
            results.append(run_backend("postgres", database_url=url, args=args))
    elif "postgres" in backends:
        print("PostgreSQL skipped: MESHYARD_TEST_POSTGRES_URL is not set", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "api", "uvicorn_workers": 1, "uvicorn": uvicorn_stack(),
        "cpus": os.cpu_count(), "load_average_at_start": round(load_at_start, 1),
        "load_average_at_end": round(os.getloadavg()[0], 1),
        "targets": {"sqlite_submissions_per_s": 300, "sqlite_p99_ms": 25},
        "params": {"jobs": args.jobs, "concurrency": args.concurrency,
                   "samples": args.samples},
        "results": results}, indent=2) + "\n")
    print(markdown(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
