"""Store on real SQLite and real PostgreSQL: idempotency, pagination, transitions, telemetry."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.lifecycle import IllegalTransition, JobState, Reason
from orchestrator.spec import parse_spec
from orchestrator.store import BadCursor, JobNotFound, Store, open_store


@pytest.fixture
def store(db_url: str) -> Store:
    s = open_store(db_url)
    yield s
    s.close()


def _spec(name: str = "j", **kw: object) -> object:
    return parse_spec({"name": name, **kw})


def test_tokens_are_hashed_and_authenticate(store: Store) -> None:
    tok = store.ensure_admin(None)
    assert tok and store.ensure_admin(None) is None  # only the first start creates one
    user = store.authenticate(tok)
    assert user is not None and user.is_admin and user.name == "admin"
    assert store.authenticate(tok + "x") is None
    from sqlalchemy import text
    with store.engine.connect() as c:
        stored = c.execute(text("select token_hash from api_tokens")).scalars().all()
    assert tok not in stored and all(len(h) == 64 for h in stored)


def test_seeded_admin_token(store: Store) -> None:
    assert store.ensure_admin("seed-secret") is None
    assert store.authenticate("seed-secret").is_admin
    assert store.ensure_admin("seed-secret") is None  # idempotent


def test_idempotent_submission_races(store: Store) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            ids.append(store.submit_job(_spec(), owner="u", submission_id="same")[0].id)
        except BaseException as exc:  # noqa: BLE001 - recorded and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(set(ids)) == 1 and len(ids) == 8
    # another owner with the same submission id is a different job
    other, created = store.submit_job(_spec(), owner="v", submission_id="same")
    assert created and other.id != ids[0]


def test_visibility_by_owner(store: Store) -> None:
    alice = store.create_user("alice")
    bob = store.create_user("bob")
    admin = store.create_user("root", admin=True)
    job, _ = store.submit_job(_spec(), owner="alice")
    assert store.get_job(job.id, viewer=alice) is not None
    assert store.get_job(job.id, viewer=bob) is None
    assert store.get_job(job.id, viewer=admin) is not None
    with pytest.raises(JobNotFound):
        store.request_cancel(job.id, viewer=bob)
    assert store.list_jobs(viewer=bob)[0] == []


def test_pagination_stable_while_jobs_are_added(store: Store) -> None:
    for i in range(25):
        store.submit_job(_spec(f"j{i}"), owner="u")
    seen: list[str] = []
    page, cursor = store.list_jobs(viewer=None, limit=10)
    seen += [j.name for j in page]
    while cursor:
        store.submit_job(_spec("late"), owner="u")  # newer jobs go on top, not into later pages
        page, cursor = store.list_jobs(viewer=None, limit=10, cursor=cursor)
        seen += [j.name for j in page]
    assert seen == [f"j{i}" for i in reversed(range(25))]
    with pytest.raises(BadCursor):
        store.list_jobs(viewer=None, cursor="garbage!")


def test_filters(store: Store) -> None:
    a, _ = store.submit_job(_spec("alpha_1"), owner="u")
    store.submit_job(_spec("beta"), owner="w")
    store.request_cancel(a.id, viewer=None)
    assert [j.name for j in store.list_jobs(viewer=None, name="alpha_")[0]] == ["alpha_1"]
    assert [j.name for j in store.list_jobs(viewer=None, name="%")[0]] == []  # escaped
    assert [j.name for j in store.list_jobs(viewer=None, owner="w")[0]] == ["beta"]
    assert [j.name for j in store.list_jobs(viewer=None, state=["CANCELLED"])[0]] == ["alpha_1"]


def test_transition_writes_state_and_event_together(store: Store) -> None:
    job, _ = store.submit_job(_spec(), owner="u")
    store.transition(job.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND, message="on n1")
    with pytest.raises(IllegalTransition):
        store.transition(job.id, JobState.SUCCEEDED, reason=Reason.COMPLETED)
    assert store.get_job(job.id).state == JobState.PLACING  # nothing written by the failure
    events = store.list_events(job.id)
    assert [(e.src, e.dst, e.reason) for e in events] == [
        (None, "QUEUED", "SUBMITTED"), ("QUEUED", "PLACING", "PLACEMENT_FOUND")]
    failed = store.transition(job.id, JobState.FAILED, reason=Reason.NO_RESOURCES, message="x")
    assert failed.failure_reason == "NO_RESOURCES"


def test_cancel_paths(store: Store) -> None:
    queued, _ = store.submit_job(_spec(), owner="u")
    assert store.request_cancel(queued.id, viewer=None).state == JobState.CANCELLED
    assert store.request_cancel(queued.id, viewer=None).state == JobState.CANCELLED  # repeat ok
    running, _ = store.submit_job(_spec(), owner="u")
    store.transition(running.id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
    assert store.request_cancel(running.id, viewer=None).state == JobState.CANCELLING


def test_concurrent_transitions_only_one_wins(store: Store) -> None:
    for _ in range(5):  # several rounds: the race must lose the same way every time
        job, _ = store.submit_job(_spec(), owner="u")
        outcomes: list[str] = []
        barrier = threading.Barrier(6)

        def go(job_id: str = job.id, out: list[str] = outcomes,
               gate: threading.Barrier = barrier) -> None:
            gate.wait(10)
            try:
                store.transition(job_id, JobState.PLACING, reason=Reason.PLACEMENT_FOUND)
                out.append("ok")
            except IllegalTransition:
                out.append("illegal")

        threads = [threading.Thread(target=go) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == ["illegal"] * 5 + ["ok"]
        assert len(store.list_events(job.id)) == 2


def test_attempts_ranks_metrics_logs_diagnoses(store: Store) -> None:
    job, _ = store.submit_job(_spec(), owner="u")
    a1 = store.start_attempt(job.id, placement={"ranks": []})
    assert a1.number == 1 and store.get_job(job.id).current_attempt == 1
    store.upsert_ranks(job.id, 1, [{"rank": 0, "node": "n1", "gpu": 0, "coords": {"tp": 0},
                                    "state": "RUNNING"}, {"rank": 1, "state": "STARTING"}])
    store.upsert_ranks(job.id, 1, [{"rank": 1, "step": 3, "phase": "forward"}])
    ranks = store.list_ranks(job.id)
    assert [(x.rank, x.state, x.step) for x in ranks] == [(0, "RUNNING", None), (1, "STARTING", 3)]
    now = time.time()
    store.add_metrics(job.id, 1, [{"rank": 0, "step": s, "time": now + s, "loss": 5.0 - s}
                                  for s in range(1, 6)])
    j = store.get_job(job.id)
    assert (j.last_step, j.last_loss) == (5, 0.0)
    assert [x.step for x in store.list_metrics(job.id, after_step=3)] == [4, 5]
    store.add_logs(job.id, 1, [{"rank": r, "line": f"hello {r}"} for r in (0, 1, 0)])
    assert [x.line for x in store.list_logs(job.id, rank=0)] == ["hello 0", "hello 0"]
    assert [x.line for x in store.list_logs(job.id, tail=1)] == ["hello 0"]
    store.set_cursor(job.id, 1, 42)
    assert store.get_cursor(job.id, 1) == 42
    d = store.add_diagnosis(job.id, 1, verdict="NOT_JOINED", culprit_ranks=[1], summary="s",
                            report={"verdict": "NOT_JOINED"})
    assert store.list_diagnoses(job.id)[0].culprit_ranks == [1] and d.id
    store.end_attempt(job.id, 1, state="FAILED", failure_reason="WORKER_CRASH", message="boom")
    assert store.list_attempts(job.id)[0].failure_reason == "WORKER_CRASH"


def test_nodes(store: Store) -> None:
    store.upsert_node(name="n1", node_id="abc", gpus=8, labels={"leaf": "l0"}, topology={"x": 1})
    store.upsert_node(name="n1-renamed", node_id="abc", gpus=8)
    assert [n.name for n in store.list_nodes()] == ["n1-renamed"]
    store.mark_nodes_dead(except_names=set())
    assert not store.list_nodes()[0].alive


def test_counts_by_state(store: Store) -> None:
    store.submit_job(_spec(), owner="u")
    counts = store.job_counts_by_state()
    assert counts["QUEUED"] == 1 and counts["RUNNING"] == 0


def test_data_survives_reopen(db_url: str) -> None:
    s1 = open_store(db_url)
    job, _ = s1.submit_job(_spec("keep"), owner="u")
    s1.add_event(job.id, kind="info", message="note")
    s1.close()
    s2 = open_store(db_url)
    assert s2.get_job(job.id).name == "keep"
    assert [e.message for e in s2.list_events(job.id)][-1] == "note"
    s2.close()


def test_cursor_advances_with_the_rows_it_covers(store: Store) -> None:
    job, _ = store.submit_job(_spec(), owner="u")
    store.start_attempt(job.id, placement=None)
    store.add_metrics(job.id, 1, [{"rank": 0, "step": 1, "time": 1.0, "loss": 2.0}], cursor=7)
    assert store.get_cursor(job.id, 1) == 7
    store.add_logs(job.id, 1, [{"rank": 0, "line": "x"}], cursor=9)
    assert store.get_cursor(job.id, 1) == 9
    store.add_metrics(job.id, 1, [{"rank": 0, "step": 2, "time": 2.0}], cursor=8)  # never back
    assert store.get_cursor(job.id, 1) == 9
    # a batch whose insert fails leaves the cursor where it was, so the replay re-sends it
    with pytest.raises(Exception):  # noqa: B017 - any DB error (NOT NULL on step) is the point
        store.add_metrics(job.id, 1, [{"rank": 0, "step": None, "time": 3.0}], cursor=20)
    assert store.get_cursor(job.id, 1) == 9


def test_revoke_tokens(store: Store) -> None:
    t1 = store.create_token("carol")
    t2 = store.create_token("carol")
    assert store.revoke_tokens("carol", token=t1) == 1
    assert store.authenticate(t1) is None and store.authenticate(t2) is not None
    assert store.revoke_tokens("carol") == 1
    assert store.authenticate(t2) is None
    with pytest.raises(LookupError):
        store.revoke_tokens("nobody")
