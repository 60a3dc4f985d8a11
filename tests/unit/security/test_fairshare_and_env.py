"""Fair order between users, the scheduler's running-quota check, and the worker
environment (scrubbed for Ray, allowlisted for actors): pure, table-driven."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.admission.fairshare import Queued, fair_order
from orchestrator.admission.quotas import Quota, Usage, running_block
from orchestrator.isolation.worker_env import allowlisted, scrub

TOTAL = Usage(gpus=16, cpus=64)


def _q(job_id: str, owner: str, seq: int, *, priority: int = 0, gpus: int = 4) -> Queued:
    return Queued(job_id, owner, priority, seq, Usage(gpus, gpus))


def test_users_alternate_at_equal_priority() -> None:
    jobs = [_q(f"a{i}", "ann", i) for i in range(4)] + [_q("b0", "bob", 10), _q("c0", "cy", 11)]
    assert [j.id for j in fair_order(jobs, held={}, total=TOTAL)] == \
        ["a0", "b0", "c0", "a1", "a2", "a3"]


def test_a_user_holding_most_of_the_cluster_waits_behind_one_holding_little() -> None:
    jobs = [_q("a0", "ann", 1), _q("b0", "bob", 2)]
    held = {"ann": Usage(gpus=12, cpus=12), "bob": Usage(gpus=2, cpus=2)}
    assert [j.id for j in fair_order(jobs, held=held, total=TOTAL)] == ["b0", "a0"]


def test_priority_still_comes_first() -> None:
    jobs = [_q("a0", "ann", 1), _q("b0", "bob", 2, priority=5)]
    held = {"bob": Usage(gpus=16, cpus=16)}
    assert [j.id for j in fair_order(jobs, held=held, total=TOTAL)] == ["b0", "a0"]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(-2, 2), st.integers(0, 8)),
                max_size=40))
def test_fair_order_is_a_priority_respecting_permutation(rows) -> None:
    jobs = [Queued(f"j{i}", o, p, i, Usage(g, 1)) for i, (o, p, g) in enumerate(rows)]
    out = fair_order(jobs, held={}, total=TOTAL)
    assert sorted(j.id for j in out) == sorted(j.id for j in jobs)
    assert [j.priority for j in out] == sorted((j.priority for j in jobs), reverse=True)
    for owner in "abcd":  # at one priority, each user's jobs keep their submission order
        for priority in range(-2, 3):
            mine = [j.seq for j in out if (j.owner, j.priority) == (owner, priority)]
            assert mine == sorted(mine)


def test_running_quota_counts_what_the_user_already_holds() -> None:
    quota = Quota(max_running_gpus=8)
    assert running_block(quota, held=Usage(4, 4), size=Usage(4, 4)) is None
    why = running_block(quota, held=Usage(6, 6), size=Usage(4, 4))
    assert why is not None and "max_running_gpus=8" in why and "hold 6 GPUs" in why
    assert running_block(Quota(), held=Usage(100, 100), size=Usage(100, 100)) is None


def test_scrub_drops_meshyard_settings_and_values_holding_secrets() -> None:
    env = {"PATH": "/usr/bin", "HOME": "/root", "MESHYARD_ADMIN_TOKEN": "msy_secret-token",
           "MESHYARD_DATABASE_URL": "postgresql://u:pw@db/m", "MESHYARD_WARM_POOL": "2",
           "DATABASE_URL": "postgresql://u:pw@db/m", "OTHER": "x", "SHORT": "ab"}
    out = scrub(env, secrets=["postgresql://u:pw@db/m", "msy_secret-token", "ab", None])
    assert out == {"PATH": "/usr/bin", "HOME": "/root", "OTHER": "x", "SHORT": "ab"}


def test_actors_keep_only_allowlisted_names() -> None:
    env = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "WARN", "RAY_NODE_ID": "n",
           "LC_ALL": "C", "AWS_SECRET_ACCESS_KEY": "k", "MESHYARD_DATABASE_URL": "sqlite://",
           "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert allowlisted(env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "WARN",
                                "RAY_NODE_ID": "n", "LC_ALL": "C"}
