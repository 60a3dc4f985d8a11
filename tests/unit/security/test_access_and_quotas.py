"""The pure policy and quota decisions, table-driven."""

from __future__ import annotations

import pytest

from orchestrator.admission.access import (
    Policy,
    Role,
    may_submit,
    module_allowed,
    path_under,
    spec_violations,
)
from orchestrator.admission.quotas import (
    Quota,
    QuotaExceeded,
    Usage,
    check_queued,
    check_submission,
    effective_quota,
    job_size,
)
from orchestrator.bounds.limits import divisors
from orchestrator.spec import parse_spec


@pytest.mark.parametrize(("n", "expected"), [
    (1, [1]), (12, [1, 2, 3, 4, 6, 12]), (49, [1, 7, 49]), (97, [1, 97]),
    (720_720, [d for d in range(1, 720_721) if 720_720 % d == 0]),
])
def test_divisors_match_the_linear_scan(n: int, expected: list[int]) -> None:
    assert divisors(n) == expected


@pytest.mark.parametrize(("module", "prefixes", "ok"), [
    ("anything", (), True),
    ("mylab", ("mylab",), True), ("mylab.models.gpt", ("mylab",), True),
    ("mylabx", ("mylab",), False), ("mylab.x", ("mylab.",), True),
    ("subprocess", ("mylab", "torchvision"), False), ("os", ("mylab",), False),
])
def test_module_prefixes(module: str, prefixes: tuple[str, ...], ok: bool) -> None:
    assert module_allowed(module, prefixes) is ok


@pytest.mark.parametrize(("path", "ok"), [
    ("/d/datasets/a.txt", True), ("/d/datasets/sub/../a.txt", True), ("/d/datasets", True),
    ("/d/datasets/../meshyard.db", False), ("/d/datasets-evil/a", False),
    ("../../etc/passwd", False), ("datasets/a.txt", False), ("/etc/passwd", False),
])
def test_paths_under_roots(path: str, ok: bool) -> None:
    assert path_under(path, ("/d/datasets",)) is ok


POLICY = Policy(code_roles=frozenset({Role.ADMIN, Role.USER}), import_prefixes=("mylab",),
                data_roots=("/d/datasets",))


def test_spec_violations_name_policy_and_setting() -> None:
    spec = parse_spec({"name": "x", "model": {"kind": "import", "path": "os:system"},
                       "data": {"kind": "text_file", "path": "/etc/passwd"}})
    found = {(v.policy, v.setting, v.loc) for v in spec_violations(spec, role=Role.USER,
                                                                   policy=POLICY)}
    assert found == {("allowed_import_prefixes", "MESHYARD_ALLOWED_IMPORT_PREFIXES",
                      "model.path"), ("data_roots", "MESHYARD_DATA_ROOTS", "data.path")}
    viewer_code = spec_violations(spec, role=Role.VIEWER, policy=POLICY)
    assert any(v.policy == "code_roles" and v.forbidden for v in viewer_code)
    assert may_submit(Role.VIEWER) is not None and may_submit(Role.USER) is None
    assert spec_violations(parse_spec({"name": "x"}), role=Role.USER, policy=POLICY) == []


def test_only_admins_mark_a_job_never_preempted() -> None:
    fixed = parse_spec({"name": "x", "preemption": {"preemptible": False}})
    refused = spec_violations(fixed, role=Role.USER, policy=POLICY)
    assert [(v.loc, v.forbidden) for v in refused] == [("preemption.preemptible", True)]
    assert "only admins" in refused[0].msg
    assert spec_violations(fixed, role=Role.ADMIN, policy=POLICY) == []
    user_code = parse_spec({"name": "u", "entrypoint": {"command": ["python", "t.py"]},
                            "preemption": {"preemptible": False}})
    assert any(v.loc == "preemption.preemptible"
               for v in spec_violations(user_code, role=Role.USER, policy=POLICY))


def test_effective_quota_and_checks() -> None:
    defaults = Quota(max_queued_jobs=100, max_priority=0)
    assert effective_quota(None, defaults=defaults, is_admin=True) == Quota()
    assert effective_quota(Quota(max_priority=9), defaults=defaults, is_admin=True) == \
        Quota(max_priority=9)
    user = effective_quota(Quota(max_running_gpus=4), defaults=defaults, is_admin=False)
    assert user == Quota(max_queued_jobs=100, max_running_gpus=4, max_priority=0)
    with pytest.raises(QuotaExceeded) as err:
        check_submission(user, priority=1, size=Usage(gpus=0, cpus=1))
    assert (err.value.quota, err.value.limit) == ("max_priority", 0)
    with pytest.raises(QuotaExceeded, match="max_running_gpus=4"):
        check_submission(user, priority=0, size=Usage(gpus=8, cpus=8))
    check_queued(user, queued=99)
    with pytest.raises(QuotaExceeded, match="max_queued_jobs=100"):
        check_queued(user, queued=100)


def test_job_size_counts_gpus_only_where_the_job_runs_on_them() -> None:
    auto = parse_spec({"name": "x", "parallelism": {"dp_replicate": 4}})
    assert job_size(auto, cluster_has_gpus=True) == Usage(gpus=4, cpus=4.0)
    assert job_size(auto, cluster_has_gpus=False) == Usage(gpus=0, cpus=4.0)
    cpu = parse_spec({"name": "x", "resources": {"device": "cpu", "cpus_per_worker": 0.5},
                      "parallelism": {"dp_replicate": 4}})
    assert job_size(cpu, cluster_has_gpus=True) == Usage(gpus=0, cpus=2.0)
