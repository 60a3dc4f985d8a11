"""Every reported metric on real SQLite and PostgreSQL: extra keys stored and bounded, the
refusal events, the raw values and the downsampled series with each bucket's min and max."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle import Reason
from orchestrator.spec import parse_spec
from orchestrator.store import Store, open_store
from orchestrator.store.metric_values import MAX_KEYS_PER_JOB


@pytest.fixture
def store(db_url: str) -> Store:
    s = open_store(db_url)
    yield s
    s.close()


def _job(store: Store) -> str:
    job, _ = store.submit_job(parse_spec({"name": "m"}), owner="admin")
    return job.id


def test_extra_keys_are_stored_and_listed_with_their_rows(store: Store) -> None:
    job = _job(store)
    store.add_metrics(job, 1, [{"rank": r, "step": s, "time": float(s), "loss": 2.0 / s,
                                "val_acc": 0.5 + s / 100 + r, "mfu": 0.25, "note": "text",
                                "flag": True, "checkpoint": "step_1"}
                               for r in (0, 1) for s in (1, 2, 3)])
    assert store.list_metric_keys(job) == ["mfu", "val_acc"]
    got = store.list_extra_values(job, rank=1, first_step=2, last_step=3, keys=None)
    assert got == {(1, 1, 2): {"val_acc": 1.52, "mfu": 0.25},
                   (1, 1, 3): {"val_acc": 1.53, "mfu": 0.25}}
    only = store.list_extra_values(job, rank=None, first_step=0, last_step=9, keys=["mfu"])
    assert len(only) == 6 and all(set(v) == {"mfu"} for v in only.values())
    # Recovered rows (a lost attempt's files) keep their extra keys too, once.
    rows = [{"rank": 0, "step": s, "time": float(s), "loss": 1.0, "val_acc": 9.0}
            for s in (3, 4)]
    assert store.add_missing_metrics(job, 1, rows) == 1
    assert store.add_missing_metrics(job, 1, rows) == 0
    assert store.list_extra_values(job, rank=0, first_step=4, last_step=4, keys=None) == {
        (1, 0, 4): {"val_acc": 9.0}}


def test_keys_past_the_bound_and_bad_names_are_dropped_with_one_event_each(store: Store
                                                                          ) -> None:
    job = _job(store)
    many = {f"k{i:03d}": float(i) for i in range(MAX_KEYS_PER_JOB + 5)}
    bad = {"bad name": 1.0, "x" * 65: 2.0, "<script>": 3.0}
    store.add_metrics(job, 1, [{"rank": 0, "step": 1, "time": 1.0, **many, **bad}])
    store.add_metrics(job, 1, [{"rank": 0, "step": 2, "time": 2.0, **many, **bad,
                                "later": 1.0}])
    keys = store.list_metric_keys(job)
    assert len(keys) == MAX_KEYS_PER_JOB and "k063" in keys and "k064" not in keys
    stored = store.list_extra_values(job, rank=0, first_step=0, last_step=9, keys=None)
    assert set(stored[(1, 0, 2)]) == set(keys)
    events = [e for e in store.list_events(job) if e.reason == Reason.METRICS_DROPPED.value]
    assert sorted(e.data["cause"] for e in events) == ["limit", "name"]
    limit = next(e for e in events if e.data["cause"] == "limit")
    assert limit.kind == "warning" and "'k064'" in limit.message and "64" in limit.message
    assert limit.data["keys"] == [f"k{i:03d}" for i in range(64, 69)]
    name = next(e for e in events if e.data["cause"] == "name")
    assert "'bad name'" in name.message and "'<script>'" in name.message


def test_series_are_bucketed_on_the_database_keeping_min_and_max(store: Store) -> None:
    job = _job(store)
    rows = []
    for s in range(1, 3001):
        spike = 50.0 if s == 1234 else 0.0
        rows += [{"rank": r, "step": s, "time": 1000.0 + s, "loss": 3.0 - s / 2000 + spike,
                  "val_loss": 3.5 - s / 2000 + r} for r in (0, 1)]
    for i in range(0, len(rows), 1000):
        store.add_metrics(job, 1, rows[i:i + 1000])
    page = store.metric_series(job, keys=["loss", "val_loss"], ranks=[0, 1], points=300)
    assert (page.from_step, page.to_step, page.bucket_steps, page.rows) == (1, 3000, 10, 6000)
    assert [(x.key, x.rank) for x in page.series] == [("loss", 0), ("loss", 1),
                                                     ("val_loss", 0), ("val_loss", 1)]
    loss = page.series[0]
    assert len(loss.step) == 300 and loss.step[:3] == [1, 11, 21] and set(loss.count) == {10}
    assert max(loss.max) == pytest.approx(50.0 + 3.0 - 1234 / 2000, rel=1e-5)  # the spike
    assert loss.min[0] == pytest.approx(3.0 - 10 / 2000, rel=1e-5)
    assert loss.time[0] == 1001.0
    assert page.series[3].mean[0] == pytest.approx(4.5 - 5.5 / 2000, rel=1e-5)
    # Zoomed in: the range holds fewer steps than points, so every row comes back as is.
    zoom = store.metric_series(job, keys=["val_loss"], ranks=[1], points=300, from_step=100,
                               to_step=199)
    assert zoom.bucket_steps == 1 and zoom.rows == 100
    (one,) = zoom.series
    assert one.step == list(range(100, 200)) and one.min == one.max == one.mean
    assert one.mean[0] == pytest.approx(4.5 - 100 / 2000)
    empty = store.metric_series(job, keys=["loss"], ranks=[7], points=100)
    assert empty.series == [] and empty.from_step is None
