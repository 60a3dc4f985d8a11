"""GET /v1/nodes, admin cordon / uncordon, and the node health gauges on /metrics, on the
app in-process with a real SQLite store (the ledger's evidence written as the poller does)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.server import prepare
from orchestrator.nodes.health_policy import Evidence, Severity
from orchestrator.runtime.node_health import record_evidence
from orchestrator.settings import Settings
from orchestrator.store.repo import Store


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Store, dict[str, str], dict[str, str]]]:
    settings = Settings(data_dir=tmp_path / "data", node_cordon_s=600)
    prepared = prepare(settings)
    store = prepared.store
    for name in ("n0", "n1", "n2"):
        store.upsert_node(name=name, node_id=f"id-{name}", gpus=4, cpus=8)
    user = store.create_token("ann")
    app = create_app(settings, store=store, runtime=None)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        yield (client, store, {"Authorization": f"Bearer {prepared.admin_token}"},
               {"Authorization": f"Bearer {user}"})
    store.close()


@pytest.mark.timeout(60)
def test_ledger_is_served_and_admins_cordon(env) -> None:
    client, store, admin, user = env
    ev = Evidence(kind="diagnosis", node="n1", severity=Severity.CORDON, verdict="COMM_WEDGED",
                  reason="COMM_WEDGED: NET/IB completion error", at=time.time(),
                  diagnosis_id=12)
    record_evidence(store, [ev], policy=Settings().health_policy())
    nodes = {n["name"]: n for n in client.get("/v1/nodes", headers=user).json()["items"]}
    assert set(nodes) == {"n0", "n1", "n2"}
    assert nodes["n1"]["state"] == "cordoned" and nodes["n1"]["diagnosis_ids"] == [12]
    assert nodes["n1"]["node_id"] == "id-n1" and nodes["n1"]["until"] is not None
    assert nodes["n0"]["state"] == "healthy" and nodes["n0"]["evidence"] == []

    # a user may read but not cordon; bad input names the field
    assert client.post("/v1/nodes/n0/cordon", json={}, headers=user).status_code == 403
    bad = client.post("/v1/nodes/n0/cordon", json={"reason": "x", "for": 3}, headers=admin)
    assert bad.status_code == 422 and "for" in bad.text
    assert client.post("/v1/nodes/nope/cordon", json={}, headers=admin).status_code == 404

    got = client.post("/v1/nodes/n0/cordon", json={"reason": "bad DIMM", "permanent": True},
                      headers=admin).json()
    assert got["state"] == "cordoned" and got["permanent"] and got["until"] is None
    assert "bad DIMM" in got["reason"] and got["evidence"][-1]["kind"] == "admin"
    assert store.get_node_health("n0") is not None  # stored: survives a restart

    text = client.get("/metrics").text
    assert 'meshyard_node_health{node="n0",state="cordoned"} 1.0' in text
    assert 'meshyard_node_health{node="n2",state="healthy"} 1.0' in text
    assert 'meshyard_node_health{node="n1",state="healthy"} 0.0' in text

    back = client.post("/v1/nodes/n1/uncordon", json={"reason": "NIC replaced"},
                       headers=admin).json()
    assert back["state"] == "healthy" and back["diagnosis_ids"] == [12]  # history kept
    assert client.get("/v1/nodes/n1", headers=user).json()["state"] == "healthy"


@pytest.mark.timeout(60)
def test_cluster_page_shows_the_health_column(env) -> None:
    client, store, admin, _ = env
    client.post("/v1/nodes/n2/cordon", json={"reason": "flaky NIC"}, headers=admin)
    token = admin["Authorization"].removeprefix("Bearer ")
    r = client.post("/login", content=f"token={token}",
                    headers={"Content-Type": "application/x-www-form-urlencoded",
                             "Origin": "http://127.0.0.1"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    html = client.get("/cluster").text
    assert "<th>Health</th>" in html
    row = html[html.index('id="node-n2"'):]
    row = row[:row.index("</tr>")]
    assert "health-cordoned" in row and "flaky NIC" in row and "until" in row
    other = html[html.index('id="node-n0"'):]
    assert "health-healthy" in other[:other.index("</tr>")]


@pytest.mark.timeout(120)
def test_node_cli_lists_cordons_and_uncordons(env) -> None:
    """The `meshyard node` commands against the app served by uvicorn on 127.0.0.1."""
    import threading

    import uvicorn
    from typer.testing import CliRunner

    from api.cli.app import app as cli

    client, store, admin, user = env
    config = uvicorn.Config(client.app, host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if srv.started:
                break
            time.sleep(0.05)
        port = srv.servers[0].sockets[0].getsockname()[1]
        url, token = f"http://127.0.0.1:{port}", admin["Authorization"].split()[1]
        run = CliRunner()
        out = run.invoke(cli, ["node", "cordon", "n1", "--reason", "ECC errors", "--permanent",
                               "--url", url, "--token", token])
        assert out.exit_code == 0, out.output
        assert "cordoned" in out.output and "permanent" in out.output
        listed = run.invoke(cli, ["node", "list", "--url", url, "--token", token])
        lines = {ln.split()[0]: ln for ln in listed.output.splitlines()}
        assert "cordoned" in lines["n1"] and "ECC errors" in lines["n1"]
        assert "healthy" in lines["n0"]
        denied = run.invoke(cli, ["node", "cordon", "n0", "--url", url, "--token",
                                  user["Authorization"].split()[1]])
        assert denied.exit_code == 1
        back = run.invoke(cli, ["node", "uncordon", "n1", "--url", url, "--token", token])
        assert back.exit_code == 0 and "healthy" in back.output, back.output
    finally:
        srv.should_exit = True
        thread.join(10)
