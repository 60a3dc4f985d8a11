"""Warm pool: pre-started worker actors are reused by the next job, carry nothing over from
the previous one, and are replaced (not reused) after a failed job. CPU jobs go to the
CPU-only node c1 of the shared cluster; GPU jobs to n1 and n2 (fake GPUs).

The module fills one pool and its tests share it (a fill is 8 actors and 8 prestarted rank
processes, each importing torch). The cold runs the pooled ones are compared with run first,
together, before the pool exists (`cold`); the test of the default settings runs last, as it
drains the pool when its runtime stops."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.settings import Settings
from orchestrator.store import open_store
from orchestrator.store.repo import Store
from tests.integration.runtime.conftest import (
    submit,
    tiny_spec,
    wait_state,
    write_cluster_file,
)
from tests.support.jobs import until


@pytest.fixture(scope="module")
def pool_settings(tmp_path_factory: pytest.TempPathFactory, ray_cluster: Any) -> Settings:
    tmp = tmp_path_factory.mktemp("warm-pool")
    return Settings(data_dir=tmp, ray_address=ray_cluster.address,
                    cluster_file=write_cluster_file(tmp / "cluster.yaml"),
                    allow_fault_injection=True)


@pytest.fixture(scope="module")
def pool_store(pool_settings: Settings) -> Iterator[Store]:
    s = open_store(f"sqlite:///{pool_settings.data_dir / 'meshyard.db'}")
    yield s
    s.close()


def _script_spec(code: Path | str, name: str, **env: str) -> dict[str, Any]:
    from tests.integration.runtime.usercode_helpers import user_spec

    return user_spec(name, {"command": ["python", "train.py", "--flag"],
                            "working_dir": str(code), "env": env},
                     resources={"device": "cpu", "cpus_per_worker": 0.5})


def _gpu_spec(name: str, record_dir: Path) -> dict[str, Any]:
    record_dir.mkdir()
    return tiny_spec(name, parallelism={"dp_replicate": 4},
                     model={"kind": "import", "path": "tests.integration.runtime."
                            "pool_model:build", "kwargs": {"record_dir": str(record_dir)},
                            "vocab_size": 64, "seq_len": 16},
                     training={"steps": 2}, checkpoint={"enabled": False})


@pytest.fixture(scope="module")
def cold(pool_settings: Settings, pool_store: Store,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script job and the 4-rank GPU job started cold (no pool: every worker a new
    actor), side by side (c1; n1 and n2), before the pool is filled."""
    from orchestrator.runtime.service import Runtime
    from tests.integration.runtime.usercode_helpers import USER_CODE

    tmp = tmp_path_factory.mktemp("cold")
    code = tmp / "shadow"
    shutil.copytree(USER_CODE / "shadow", code)
    rt = Runtime(pool_settings, pool_store, tick_s=0.2, warm_pool=0)
    rt.start()
    try:
        script_id = submit(pool_store, _script_spec(code, "script-cold", MY_SETTING="on"))
        gpu_id = submit(pool_store, _gpu_spec("gpu-cold", tmp / "gpu-cold"))
        script = wait_state(pool_store, script_id, JobState.SUCCEEDED, JobState.FAILED,
                            timeout_s=300)
        gpu = wait_state(pool_store, gpu_id, JobState.SUCCEEDED, JobState.FAILED,
                         timeout_s=300)
    finally:
        rt.stop()
    assert script.state == JobState.SUCCEEDED, script.message
    assert gpu.state == JobState.SUCCEEDED, gpu.message
    return {"code": code, "script": script_id, "gpu": gpu_id, "gpu_dir": tmp / "gpu-cold"}


@pytest.fixture(scope="module")
def runtime(pool_settings: Settings, pool_store: Store, cold: dict[str, Any]) -> Iterator[Any]:
    from orchestrator.runtime.service import Runtime

    rt = Runtime(pool_settings, pool_store, tick_s=0.2, warm_pool=2)
    rt.start()
    try:
        yield rt
    finally:
        rt.stop()


@pytest.fixture()
def pooled(runtime: Any) -> Any:
    """The module's runtime with its pool full (8 workers on 4 nodes; minutes on a loaded
    2-core machine)."""
    runtime.wait_for_pool(timeout_s=300)
    return runtime


def _spec(name: str, **over: Any) -> dict[str, Any]:
    model = {"kind": "import", "path": "tests.integration.runtime.pool_model:build",
             "kwargs": over.pop("kwargs", {}), "vocab_size": 64, "seq_len": 16}
    return tiny_spec(name, model=model, resources={"device": "cpu", "cpus_per_worker": 0.5},
                     training={"steps": 2}, checkpoint={"enabled": False}, **over)


def _pids(store, job_id: str) -> set[int]:
    return {r.pid for r in store.list_ranks(job_id)}


def _wait_cpus_free(timeout_s: float = 120.0) -> None:
    """Until every node's CPUs are free: a finished job's placement group is removed after
    its state is written, and a CPU job goes to the node with the most free CPUs (ties by
    name: c1 first), whose idle warm actors it leases."""
    from orchestrator.runtime.nodes import read_ray_nodes

    until(lambda: all(n.free_cpus >= n.cpus for n in read_ray_nodes()), timeout_s=timeout_s,
          poll_s=0.5, what="every node's CPUs free (the last job's placement group removed)")


def _history(store: Store, job_id: str) -> list[str]:
    """The job's events, for a failure message: an attempt that failed and was restarted
    explains workers that were not reused."""
    return [f"{e.kind}: {e.message}" for e in store.list_events(job_id)]


@pytest.mark.slow
def test_pooled_workers_are_reused_isolated_and_replaced_after_failure(pooled, pool_store):
    runtime, store = pooled, pool_store
    _wait_cpus_free()  # both jobs land on c1
    first = submit(store, _spec("pollutes"))
    assert wait_state(store, first, JobState.SUCCEEDED, JobState.FAILED).state == \
        JobState.SUCCEEDED
    # The job is SUCCEEDED before its controller hands its actors back and before its
    # placement group is removed: placed before that, the next job would go to another node
    # and lease the idle ones there.
    runtime.wait_for_pool(timeout_s=300)
    _wait_cpus_free()
    # The second job's model raises if the first job's env var or module state survived.
    second = submit(store, _spec("expects-clean", kwargs={"expect_clean": True}))
    job = wait_state(store, second, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED, job.message
    # same warm processes, reused (else the pool says why it retired them)
    assert _pids(store, second) == _pids(store, first), \
        (runtime.pool_status(max_age_s=0), _history(store, first), _history(store, second))

    crashed = submit(store, _spec("crashes", fault_tolerance={"max_failures": 0},
                                  inject_fault={"kind": "crash", "rank": 0, "step": 1}))
    assert wait_state(store, crashed, JobState.FAILED, JobState.SUCCEEDED).state == \
        JobState.FAILED
    runtime.wait_for_pool(timeout_s=300)  # refilled
    after = submit(store, _spec("after-crash", kwargs={"expect_clean": True}))
    job = wait_state(store, after, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED, job.message
    # the failed job's processes were not reused
    assert not (_pids(store, after) & _pids(store, crashed))


def _script_job(store: Store, code: Path | str, name: str, **env: str) -> tuple[str, Any]:
    job_id = submit(store, _script_spec(code, name, **env))
    return job_id, wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED,
                              timeout_s=240)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_script_job_from_the_pool_runs_as_it_does_cold_and_isolated(
        pooled, pool_store, pool_settings, cold):
    """The shadow script (own api / workers / orchestrator packages, a gloo all-reduce,
    three reports) cold (pool at 0) and then twice from the pool (its directory, then as an
    uploaded package): the same events, metrics, environment and module resolution; the pooled
    rank is the actor's prestarted process (meshyard/_prestart.py), a new one per job; nothing
    of the first pooled job's environment reaches the second, and no control-plane variable
    reaches either."""
    from tests.integration.runtime.usercode_helpers import rank_json, ship

    runtime, store, settings = pooled, pool_store, pool_settings
    code, cold_id = cold["code"], cold["script"]
    warm_id, warm = _script_job(store, code, "script-pooled", MY_SETTING="on")
    assert warm.state == JobState.SUCCEEDED, warm.message
    runtime.wait_for_pool(timeout_s=300)
    # The next one from an uploaded package: the pooled actor unpacks it as Ray would.
    next_id, nxt = _script_job(store, ship(settings, code), "script-pooled-package")
    assert nxt.state == JobState.SUCCEEDED, nxt.message

    def seen(job_id: str) -> dict[int, dict[str, Any]]:
        return {r: rank_json(settings.resolved_runs_dir / job_id, r) for r in (0, 1)}

    def events(job_id: str) -> list[tuple[str, str]]:
        return [(e.dst, e.reason) for e in store.list_events(job_id) if e.kind == "state"]

    job_keys = ("MESHYARD_JOB_ID", "MESHYARD_RUN_DIR", "MESHYARD_CHECKPOINT_DIR",
                "MESHYARD_REPORT_FILE", "MESHYARD_PROBE_DIR")
    c, w, n = seen(cold_id), seen(warm_id), seen(next_id)
    assert events(warm_id) == events(cold_id)
    assert [(m.rank, m.step, m.loss) for m in store.list_metrics(warm_id)] == \
        [(m.rank, m.step, m.loss) for m in store.list_metrics(cold_id)]
    for r in (0, 1):
        # Every rank ran its pre-flight check in the process that then became the rank: the
        # cold one started for it (the job's own), the pooled ones the pool had started.
        assert c[r]["cmdline"][1:3] == w[r]["cmdline"][1:3] == n[r]["cmdline"][1:3] == [
            "-m", "meshyard._prestart"]
        assert w[r]["pid"] != n[r]["pid"]  # one process per rank, never reused
        # RAY_JOB_ID names the Ray job the worker actor was created under: the detached pool's
        # (which outlives the driver that made it) or the attempt controller's; RAY_RAYLET_PID
        # names the node's raylet, and a pooled worker may sit on another node than the cold one.
        per_process = ("MASTER_PORT", "MESHYARD_PARENT_PID", "RAY_JOB_ID", "RAY_RAYLET_PID")
        envs = [{k: v for k, v in x[r]["env"].items() if k not in per_process
                 and job_id not in v} for x, job_id in ((c, cold_id), (w, warm_id))]
        assert envs[0] == envs[1]
        assert set(c[r]["env"]) == set(w[r]["env"])
        for k in ("argv", "sum", "cwd", "modules"):
            assert w[r][k] == c[r][k], k
        assert w[r]["env"]["MY_SETTING"] == "on" and "MY_SETTING" not in n[r]["env"]
        assert n[r]["cwd"].endswith("/meshyard-code") and n[r]["sum"] == 3.0
        assert all(f.startswith(n[r]["cwd"]) for f in n[r]["modules"].values())
        for x in (c, w, n):
            leaked = [k for k in x[r]["env"] if k.startswith("MESHYARD_")
                      and k not in job_keys and k not in _RANK_PROTOCOL]
            assert not leaked, leaked
        assert {p.pid for p in store.list_ranks(warm_id)} == {w[0]["pid"], w[1]["pid"]}


_RANK_PROTOCOL = ("MESHYARD_ATTEMPT", "MESHYARD_MESH_DIM_NAMES", "MESHYARD_MESH_SHAPE", "MESHYARD_STOP_FILE",
                  "MESHYARD_ZERO_STAGE", "MESHYARD_INIT_TIMEOUT_S", "MESHYARD_PARENT_PID")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_gpu_job_from_the_pool_sees_the_gpus_and_ranks_a_cold_one_does(
        pooled, pool_store, cold, tmp_path):
    """Fake GPUs (n1, n2: two each): the same 4-rank GPU job cold (no pool) and from the
    pool. A pooled actor was created with no GPU (Ray assigned it none), yet every rank sees
    CUDA_VISIBLE_DEVICES = its bundle's GPU, the GPU the store names for it, and the ranks
    land on the same nodes with the same GPUs per node and local ranks as cold."""
    store = pool_store

    def seen(job_id: str, out: Path) -> tuple[dict[int, dict[str, Any]], list[Any]]:
        job = store.get_job(job_id)
        assert job is not None and job.state == JobState.SUCCEEDED, job
        assert store.list_attempts(job_id)[-1].placement["device"] == "gpu"
        return ({r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)},
                store.list_ranks(job_id))

    warm_id = submit(store, _gpu_spec("gpu-pooled", tmp_path / "gpu-pooled"))
    wait_state(store, warm_id, JobState.SUCCEEDED, JobState.FAILED, timeout_s=300)
    cold, cold_ranks = seen(cold["gpu"], cold["gpu_dir"])
    warm, warm_ranks = seen(warm_id, tmp_path / "gpu-pooled")
    for seen_, ranks, is_pooled in ((cold, cold_ranks, False), (warm, warm_ranks, True)):
        for r in ranks:
            assert seen_[r.rank]["CUDA_VISIBLE_DEVICES"] == str(r.gpu), (is_pooled, r, seen_)
            # Ray gave the cold actor its GPU; the pooled one had none from Ray
            assert seen_[r.rank]["ray_gpu_ids"] == ([] if is_pooled else [r.gpu])
    assert not {r.pid for r in warm_ranks} & {r.pid for r in cold_ranks}

    def layout(seen, ranks):  # noqa: ANN001, ANN202
        per_node: dict[str, set[int]] = {}
        for r in ranks:
            per_node.setdefault(r.node, set()).add(r.gpu)
        return ({r.rank: (r.node, seen[r.rank]["LOCAL_RANK"], seen[r.rank]["LOCAL_WORLD_SIZE"])
                 for r in ranks}, per_node)
    assert layout(warm, warm_ranks) == layout(cold, cold_ranks)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_leased_by_a_controller_that_is_killed_are_killed_and_replaced(
        pooled, pool_store):
    """A controller killed while its job runs (a forced cancel, the orphan sweep, its node
    lost) hands nothing back: the pool kills the pooled workers it leased, which would
    otherwise go on training outside any placement group, and refills the node."""
    import psutil

    from orchestrator.runtime.controller import recorded_controller_name
    from orchestrator.runtime.poller import kill_controller
    from tests.integration.runtime.conftest import wait_for

    runtime, store = pooled, pool_store
    spec = _spec("abandoned", fault_tolerance={"max_failures": 0})
    spec["training"] = {**spec["training"], "steps": 100_000}
    job_id = submit(store, spec)
    job = wait_for(store, job_id, lambda j: j.state == JobState.RUNNING
                   and bool(rs := store.list_ranks(j.id)) and all(r.step for r in rs),
                   what="training")
    pids = _pids(store, job_id)
    assert pids and all(psutil.pid_exists(p) for p in pids)
    n = job.current_attempt
    kill_controller(job_id, n, recorded_controller_name(store, job_id, n))
    assert wait_state(store, job_id, JobState.FAILED, JobState.SUCCEEDED).state == \
        JobState.FAILED
    runtime.wait_for_pool(timeout_s=240)  # the node is refilled: nothing counted as leased
    status = runtime.pool_status(max_age_s=0)
    assert status is not None and all(r["leased"] == 0 for r in status["nodes"].values())

    def alive() -> list[int]:
        out = []
        for p in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    # The pool kills them through Ray, which ends the processes shortly after (seconds on a
    # loaded host); a generous bound, not a measured time.
    until(lambda: not alive(), timeout_s=60,
          what=f"the killed controller's leased workers (pids {sorted(pids)}) to end")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_standby_leaves_the_pool_to_the_leader_and_fills_it_when_it_takes_over(
        pooled, pool_settings, postgres_url):
    """Two control planes on one PostgreSQL share the cluster's pool. The standby's settings
    do not resize it and its stop does not drain it (a rolling restart of the standby leaves
    the leader's jobs their warm workers); the leader's stop drains it, and the standby that
    takes over fills it again at its own size. Ends with the pool drained."""
    import ray

    from orchestrator.runtime.pool import find_pool
    from orchestrator.runtime.service import Runtime
    from orchestrator.store import open_store
    from tests.support.jobs import until

    pool = find_pool()
    assert pool is not None

    def status() -> dict[str, Any]:
        return ray.get(pool.status.remote(), timeout=30)

    full = status()
    assert full["size"] == 2 and not full["draining"]
    idle = {n: r["idle"] for n, r in full["nodes"].items()}
    assert idle and all(v == 2 for v in idle.values())
    stores = [open_store(postgres_url) for _ in range(3)]
    runtimes: list[Any] = []
    try:
        leader = Runtime(pool_settings, stores[0], tick_s=0.2, warm_pool=2)
        runtimes.append(leader)
        leader.start()
        assert leader.is_leader
        standby = Runtime(pool_settings, stores[1], tick_s=0.2, warm_pool=1)
        runtimes.append(standby)
        standby.start()
        assert not standby.is_leader
        standby.stop()
        after = status()
        assert after["size"] == 2 and not after["draining"], after
        assert {n: r["idle"] for n, r in after["nodes"].items()} == idle

        successor = Runtime(pool_settings, stores[2], tick_s=0.2, warm_pool=1)
        runtimes.append(successor)
        successor.start()
        assert not successor.is_leader
        leader.stop()  # drains: the successor takes over and fills it at its size
        until(lambda: successor.is_leader, timeout_s=30, what="the standby leads")
        refilled = until(
            lambda: (st := status())["size"] == 1 and not st["draining"] and all(
                r["idle"] == 1 for r in st["nodes"].values()) and st,
            timeout_s=240, what="the pool filled by the new leader at its size")
        assert set(refilled["nodes"]) == set(idle)
        successor.stop()
        assert status()["draining"]
    finally:
        for rt in runtimes:
            rt.stop()
        for st in stores:
            st.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pool_is_on_by_default_shown_on_cluster_page_and_metrics_and_drained_on_stop(
        settings, store, runtime):
    import ray
    from fastapi.testclient import TestClient

    from api.app import create_app
    from orchestrator.runtime.pool import find_pool
    from orchestrator.runtime.service import Runtime
    from orchestrator.settings import CLUSTER_WARM_POOL

    # The module's runtime goes first (its orphan sweep would kill this runtime's controllers:
    # another database), without draining, as a control plane that dies: the new one takes
    # the detached pool it left, at its own size.
    runtime.warm_pool = 0
    runtime.stop()
    rt = Runtime(settings, store, tick_s=0.2)  # no warm_pool: the default for a Ray cluster
    assert rt.warm_pool == CLUSTER_WARM_POOL == settings.resolved_warm_pool
    store.ensure_admin("pool-admin-token")
    with TestClient(create_app(settings, store=store, runtime=rt),
                    base_url="http://127.0.0.1:8470") as client:
        rt.wait_for_pool(timeout_s=150)
        status = rt.pool_status(max_age_s=0)
        assert status is not None and status["size"] == CLUSTER_WARM_POOL
        assert status["nodes"] and all(r["idle"] == CLUSTER_WARM_POOL
                                       for r in status["nodes"].values())
        # torch is imported in every idle worker: well over 100 MiB each
        assert all(r["idle_rss_bytes"] > 100 * 2**20 for r in status["nodes"].values())
        text = client.get("/metrics").text
        assert f"meshyard_warm_pool_size {float(CLUSTER_WARM_POOL)}" in text
        for node in status["nodes"]:
            assert f'meshyard_warm_pool_idle_workers{{node_id="{node}"}} 1.0' in text
        r = client.post("/login", content="token=pool-admin-token",
                        headers={"content-type": "application/x-www-form-urlencoded"},
                        follow_redirects=False)
        assert r.status_code == 303, r.text
        page = client.get("/cluster").text
        assert 'id="warm-pool"' in page and "per node" in page
        # A default-settings CPU job runs on the pooled worker, which is refilled after.
        job_id = submit(store, _spec("default-pool"))
        job = wait_state(store, job_id, JobState.SUCCEEDED, JobState.FAILED)
        assert job.state == JobState.SUCCEEDED, job.message
        rt.wait_for_pool(timeout_s=150)
        reused = rt.pool_status(max_age_s=0)
        assert reused is not None
        assert all(r["idle_rss_bytes"] > 100 * 2**20 for r in reused["nodes"].values())
    pool = find_pool()  # drained on stop: nothing idle, no refilling
    assert pool is not None
    after = ray.get(pool.status.remote(), timeout=30)
    assert after["draining"] and all(r["idle"] == 0 for r in after["nodes"].values())
