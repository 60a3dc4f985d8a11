"""Hostile inputs against a real `meshyard serve` (SQLite and PostgreSQL): plan requests that
name server paths, numbers past every column, NaN, NUL and control characters, and a store
that stops answering while /readyz kept saying ready.

Each case was reproduced by hand before the fix: a plan naming `<data dir>/meshyard.db` made
the server read (and drop the locks of) its own database, a FIFO hung the request, integers
past 64 bits answered 500 and reset the connection, `logs/follow?after=1e30` aborted a stream
after its headers.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from orchestrator.store.db import make_engine
from tests.integration.api.conftest import Server, Users, database

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOPO_M = (FIXTURES / "topo" / "topo_h100_8gpu_nv18_no_nics.txt").read_text()


def _plan(node: dict[str, object]) -> dict[str, object]:
    return {"model": "llama-7b", "global_batch": 16, "gpus": 8,
            "cluster": {"levels": [], "nodes": [{"name": "n0", **node}]}}


def test_plan_requests_never_make_the_server_open_a_path(server: Server, users: Users,
                                                         tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it blocks forever: the request would hang
    targets = [server.data_dir / "meshyard.db", server.data_dir / "admin.token", fifo,
               tmp_path / "does-not-exist", "../../../../etc/passwd"]
    details = set()
    with server.client(users.alice) as http:
        for path in targets:
            r = http.post("/v1/plans", json=_plan({"topo_m_file": str(path)}), timeout=10)
            assert r.status_code == 422, r.text
            body = r.json()
            assert body["errors"][0]["loc"] == "cluster"
            assert "never read from disk" in body["detail"] and "topo_m" in body["detail"]
            details.add(body["detail"])
        # The answer is the same whether the path exists, is a FIFO or is missing.
        assert len(details) == 1, details
        assert str(server.data_dir) not in details.pop()
        big = http.post("/v1/plans", json=_plan({"topo_m": TOPO_M * 200}), timeout=10)
        assert big.status_code == 422 and "characters" in big.json()["detail"]
        inline = http.post("/v1/plans", json=_plan({"topo_m": TOPO_M}), timeout=60)
        assert inline.status_code == 200, inline.text  # what a well-behaved request does
        # The server's own database is intact and answering.
        made = http.post("/v1/jobs", json={"name": f"after-plans-{uuid.uuid4().hex[:6]}"})
        assert made.status_code == 201
        assert httpx.get(server.url + "/readyz", timeout=5).status_code == 200


def _rename_jobs(url: str | None, data_dir: Path, *, back: bool) -> None:
    old, new = ("jobs_gone", "jobs") if back else ("jobs", "jobs_gone")
    if url is None:  # the embedded SQLite file
        with sqlite3.connect(data_dir / "meshyard.db", timeout=30) as conn:
            conn.execute(f"ALTER TABLE {old} RENAME TO {new}")
        return
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    finally:
        engine.dispose()


def _readyz_until(url: str, status: int, timeout_s: float = 15) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(url + "/readyz", timeout=5)
        if r.status_code == status or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_readyz_fails_when_the_store_cannot_answer_a_query(kind: str, tmp_path: Path) -> None:
    with database(kind) as url:
        srv = Server(data_dir=tmp_path / "data", database_url=url).start()
        try:
            assert _readyz_until(srv.url, 200).status_code == 200
            _rename_jobs(url, srv.data_dir, back=False)  # the schema revision still reads fine
            try:
                r = _readyz_until(srv.url, 503)
                assert r.status_code == 503, r.text
                assert r.json()["database"] is False
                assert "cannot answer a query" in r.json()["detail"]
            finally:
                _rename_jobs(url, srv.data_dir, back=True)
            assert _readyz_until(srv.url, 200).status_code == 200
        finally:
            srv.stop()


def _cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"s": seq}).encode()).decode().rstrip("=")


def test_numbers_past_their_columns_are_422s_naming_the_parameter(server: Server,
                                                                   users: Users) -> None:
    with server.client(users.alice) as http:
        job = http.post("/v1/jobs", json={"name": f"ints-{uuid.uuid4().hex[:6]}"}).json()["id"]
        base = f"/v1/jobs/{job}"
        cases = [
            ("POST", "/v1/jobs", {"json": {"name": "x", "parallelism": {"dp_replicate": 10**19}}},
             "parallelism.dp_replicate"),
            ("POST", "/v1/jobs", {"json": {"name": "x", "parallelism": {"dp_replicate": 10**12}}},
             "parallelism.dp_replicate"),
            ("POST", "/v1/jobs", {"json": {"name": "x", "training": {"seed": 2**40}}},
             "training.seed"),
            ("POST", "/v1/jobs", {"json": {"name": "x", "priority": 10**30}}, "priority"),
            ("GET", "/v1/jobs", {"params": {"cursor": _cursor(10**30)}}, "query.cursor"),
            ("GET", "/v1/jobs", {"params": {"cursor": _cursor(-1)}}, "query.cursor"),
            ("GET", f"{base}/events", {"params": {"after": 2**63}}, "query.after"),
            ("GET", f"{base}/events", {"params": {"after": 10**30}}, "query.after"),
            ("GET", f"{base}/logs", {"params": {"after": 2**63}}, "query.after"),
            ("GET", f"{base}/logs", {"params": {"rank": 2**31}}, "query.rank"),
            ("GET", f"{base}/metrics", {"params": {"rank": 2**31}}, "query.rank"),
            ("GET", f"{base}/metrics", {"params": {"after_step": 2**31}}, "query.after_step"),
            ("GET", f"{base}/ranks", {"params": {"attempt": 2**31}}, "query.attempt"),
            ("GET", f"{base}/logs/follow", {"params": {"after": 10**30}}, "query.after"),
            ("GET", f"{base}/logs/follow", {"params": {"rank": 2**63}}, "query.rank"),
        ]
        for method, path, kwargs, loc in cases:
            r = http.request(method, path, timeout=10, **kwargs)
            assert r.status_code == 422, (path, kwargs, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert loc in [e["loc"] for e in r.json()["errors"]], (loc, r.text)
        # In range, the same parameters work (and the connection is still in use).
        assert http.get(f"{base}/events", params={"after": 2**63 - 1}).status_code == 200
        assert http.get(f"{base}/ranks", params={"attempt": 2**31 - 1}).status_code == 200


def test_nan_infinity_nul_and_control_characters_are_refused(server: Server,
                                                             users: Users) -> None:
    json_h = {"Content-Type": "application/json"}
    yaml_h = {"Content-Type": "application/yaml"}
    cases = [
        ('{"name": "x", "training": {"lr": NaN}}', json_h, "training.lr"),
        ('{"name": "x", "training": {"grad_clip": Infinity}}', json_h, "training.grad_clip"),
        ('{"name": "x", "model": {"kind": "import", "path": "m:f", "kwargs": {"a": -Infinity}}}',
         json_h, "model.kwargs.a"),
        ("name: x\ntraining:\n  grad_clip: .inf\n", yaml_h, "training.grad_clip"),
        ("name: x\nmodel:\n  kind: import\n  path: m:f\n  kwargs: {a: .nan}\n", yaml_h,
         "model.kwargs.a"),
        ('{"name": "a\\u0000b"}', json_h, "name"),
        ('{"name": "red \\u001b[31m alert"}', json_h, "name"),
        ('{"name": "x", "model": {"kind": "import", "path": "m:f", "kwargs": {"k\\u0000": 1}}}',
         json_h, "model.kwargs.<key>"),
        ('{"name": "x", "priority": 1' + "0" * 5000 + "}", json_h, "<root>"),
        ("name: x\npriority: 1" + "0" * 5000 + "\n", yaml_h, "<root>"),
    ]
    with server.client(users.alice) as http:
        for body, headers, loc in cases:
            r = http.post("/v1/jobs", content=body.encode(), headers=headers, timeout=10)
            assert r.status_code == 422, (body[:80], r.text)
            assert loc in [e["loc"] for e in r.json()["errors"]], (body[:80], r.text)
        for params in ({"owner": "a\x00b"}, {"name": "\x00"}, {"name": "\x1b[2J"}):
            r = http.get("/v1/jobs", params=params)
            assert r.status_code == 422, (params, r.text)
        r = http.get("/v1/jobs/job-%00")
        assert r.status_code == 422, r.text
        assert http.get("/v1/jobs/job-doesnotexist").status_code == 404


def test_expensive_specs_answer_422_at_once(server: Server, users: Users) -> None:
    """The hand-reproduced cost (4.3 s of CPU for this one) is measured by line counts in
    tests/unit/security/test_validation_work.py; here, that the server answers it."""
    with server.client(users.alice) as http:
        r = http.post("/v1/jobs", json={"name": "x", "parallelism": {"tp": 2},
                                        "model": {"d_ff": 100_000_001}}, timeout=10)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "model.d_ff"
        r = http.post("/v1/plans", json=_plan({"gpus": 1000}), timeout=10)
        assert r.status_code == 422 and "at most 64" in r.json()["detail"]
        r = http.post("/v1/plans", json={"model": "llama-7b", "global_batch": 10**12},
                      timeout=10)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "global_batch"
