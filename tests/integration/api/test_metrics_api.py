"""GET /v1/jobs/{id}/metrics and /metrics/series on the app in-process, on real SQLite and
PostgreSQL: every reported key served, keys asked for, the series downsampled on the server
with each bucket's min and max, the payload bounded, and the bounds on every parameter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.server import prepare
from orchestrator.settings import Settings
from orchestrator.store.repo import Store


@pytest.fixture
def env(tmp_path: Path, db_url: str) -> Iterator[tuple[TestClient, Store, dict[str, str]]]:
    settings = Settings(data_dir=tmp_path / "data", database_url=db_url)
    prepared = prepare(settings)
    app = create_app(settings, store=prepared.store, runtime=None)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        yield client, prepared.store, {"Authorization": f"Bearer {prepared.admin_token}"}
    prepared.store.close()


def _job_with_steps(client: TestClient, store: Store, auth: dict[str, str], *, steps: int,
                    ranks: int = 1) -> str:
    jid = client.post("/v1/jobs", json={"name": "metrics"}, headers=auth).json()["id"]
    rows = [{"rank": r, "step": s, "time": 1.7e9 + s * 0.731, "loss": 3.0 / (1 + s / 100),
             "grad_norm": 1.2345678, "tokens_per_s": 12345.678 + s, "step_time_s": 0.1234567,
             "lr": 3e-4, "val_loss": 3.3 / (1 + s / 100) + (40.0 if s == 2222 else 0.0),
             "val_acc": s / steps, "mfu": 0.4123}
            for s in range(1, steps + 1) for r in range(ranks)]
    for i in range(0, len(rows), 2000):
        store.add_metrics(jid, 1, rows[i:i + 2000])
    return jid


def test_raw_rows_carry_every_reported_key_or_those_asked_for(env) -> None:
    client, store, auth = env
    jid = _job_with_steps(client, store, auth, steps=5, ranks=2)
    got = client.get(f"/v1/jobs/{jid}/metrics", params={"rank": 1}, headers=auth).json()
    assert set(got["keys"]) == {"val_loss", "val_acc", "mfu"}
    assert [p["step"] for p in got["items"]] == [1, 2, 3, 4, 5]
    assert got["items"][4]["values"] == {"val_loss": pytest.approx(3.3 / 1.05),
                                         "val_acc": 1.0, "mfu": 0.4123}
    some = client.get(f"/v1/jobs/{jid}/metrics", params={"keys": "val_acc,nope"},
                      headers=auth).json()
    assert len(some["items"]) == 10 and all(set(p["values"]) == {"val_acc"}
                                            for p in some["items"])
    none = client.get(f"/v1/jobs/{jid}/metrics", params={"keys": ""}, headers=auth).json()
    assert all(p["values"] == {} for p in none["items"])
    bad = client.get(f"/v1/jobs/{jid}/metrics", params={"keys": "a b"}, headers=auth)
    assert bad.status_code == 422


def test_a_3000_step_job_is_downsampled_on_the_server_keeping_spikes(env) -> None:
    client, store, auth = env
    jid = _job_with_steps(client, store, auth, steps=3000)
    raw = client.get(f"/v1/jobs/{jid}/metrics", params={"rank": 0, "limit": 10_000,
                                                        "keys": ""}, headers=auth)
    keys = "loss,tokens_per_s,lr,grad_norm,val_loss,val_acc,mfu"
    t0 = time.perf_counter()
    series = client.get(f"/v1/jobs/{jid}/metrics/series",
                        params={"keys": keys, "points": 300}, headers=auth)
    took = time.perf_counter() - t0
    assert series.status_code == 200, series.text
    page = series.json()
    # Seven metrics of 3,000 steps, min and max per bucket, in an eighth of the bytes of the
    # raw rows' fixed fields alone.
    assert len(raw.content) > 750_000 and len(series.content) < 110_000, (
        len(raw.content), len(series.content))
    assert took < 2.0
    assert page["bucket_steps"] == 10 and page["rows"] == 3000
    assert [x["key"] for x in page["items"]] == keys.split(",")
    val = next(x for x in page["items"] if x["key"] == "val_loss")
    assert len(val["step"]) == 300 and max(val["max"]) > 40 and max(val["mean"]) < 10
    # Zoomed to the spike: every row, the spike itself.
    zoom = client.get(f"/v1/jobs/{jid}/metrics/series",
                      params={"keys": "val_loss", "from_step": 2200, "to_step": 2249},
                      headers=auth).json()
    (z,) = zoom["items"]
    assert zoom["bucket_steps"] == 1 and z["step"] == list(range(2200, 2250))
    assert z["mean"][22] == z["max"][22] > 40 and set(z["count"]) == {1}


def test_per_rank_series_and_bounds(env) -> None:
    client, store, auth = env
    jid = _job_with_steps(client, store, auth, steps=50, ranks=3)
    page = client.get(f"/v1/jobs/{jid}/metrics/series",
                      params={"keys": "val_acc,loss", "ranks": "2,0", "points": 10},
                      headers=auth).json()
    assert [(x["key"], x["rank"]) for x in page["items"]] == [
        ("val_acc", 0), ("val_acc", 2), ("loss", 0), ("loss", 2)]
    assert page["bucket_steps"] == 5 and all(len(x["step"]) == 10 for x in page["items"])
    url = f"/v1/jobs/{jid}/metrics/series"
    for params in ({"keys": "loss", "points": 5}, {"keys": "loss", "points": 2001},
                   {"keys": ",".join(f"k{i}" for i in range(33))},
                   {"keys": "loss", "ranks": ",".join(str(i) for i in range(17))},
                   {"keys": "loss", "ranks": "-1"}, {"keys": "loss", "from_step": 2**31},
                   {"keys": "loss", "from_step": 9, "to_step": 3}, {"keys": ""},
                   {"keys": "loss", "ranks": "9" * 40}):
        r = client.get(url, params=params, headers=auth)
        assert r.status_code == 422, (params, r.status_code, r.text)
    unknown = client.get(url, params={"keys": "nothing_reported"}, headers=auth).json()
    assert unknown["items"] == [] and unknown["rows"] == 50


def test_the_ray_train_driver_history_has_every_reported_key_without_the_run_dir(env) -> None:
    """fit()'s result reads every numeric key from the service (no run dir needed)."""
    from api.client import MeshyardClient
    from api.fit import metrics_history
    from tests.unit.dashboard.test_insight_routes import InProcess

    client, store, auth = env
    jid = _job_with_steps(client, store, auth, steps=3, ranks=2)
    with MeshyardClient("http://127.0.0.1", auth["Authorization"].split()[1],
                        transport=InProcess(client)) as api:
        history = metrics_history(api, jid)
    assert [h["step"] for h in history] == [1, 2, 3]
    assert history[-1]["val_acc"] == 1.0 and history[-1]["mfu"] == 0.4123
    assert history[-1]["loss"] == pytest.approx(3.0 / 1.03) and "values" not in history[-1]
