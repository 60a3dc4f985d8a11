"""Startup latency: REST submit → first completed training step of a 2-rank DDP job.

Peers, same model and data (examples/tiny/ddp.yaml on CPU/gloo, the workers core's loop):
  * meshyard  — POST /v1/jobs on a running service (uvicorn + runtime, local Ray already up)
                until the first step's metric; cold (fresh worker actors) and warm (the pool
                of pre-started, torch-imported worker actors: the default settings);
  * Ray Train — TorchTrainer.fit() on the same running Ray until rank 0's first step;
  * torchrun  — `torchrun --standalone --nproc_per_node=2 -m workers.loop.launch` until the first
                step in metrics.jsonl.

User code (the `script` rows: bench/byo/train.py, a plain 2-rank DDP script that reports each
step with meshyard.train under meshyard):
  * meshyard  — `MeshyardClient.submit_with_code` (what `meshyard submit --working-dir` does:
                zip, upload, submit) until the first report's metric; cold (fresh worker
                actors) and warm (the default settings: pooled actors, each with a rank
                process that has imported torch, meshyard/_prestart.py), back to back and
                spaced (SPACED_S apart: the pool's new prestarted processes ready);
  * torchrun  — `torchrun --nnodes=1 --nproc_per_node=2 train.py` until its first step.

    .venv/bin/python bench/startup.py [--repeats 3] [--out bench/results/startup.json]

The first step's time is the wall clock the worker stamped on its metrics (same machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

SPEC_FILE = REPO / "examples" / "tiny" / "ddp.yaml"
SCRIPT_DIR = REPO / "bench" / "byo"
STEPS = 3


def bench_spec() -> dict[str, Any]:
    spec = yaml.safe_load(SPEC_FILE.read_text())
    spec["training"]["steps"] = STEPS
    spec["resources"] = {"device": "cpu", "cpus_per_worker": 1}
    return dict(spec)


# -- torchrun --------------------------------------------------------------------------------
def _torchrun() -> list[str]:
    """The venv's `torchrun` script, else the module it runs (the same entry point)."""
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_torchrun(work: Path, i: int) -> float:
    out = work / f"torchrun-{i}"
    spec = work / "spec.yaml"
    spec.write_text(yaml.safe_dump(bench_spec()))
    t0 = time.time()
    subprocess.run([*_torchrun(), "--standalone", "--nproc_per_node=2", "-m", "workers.loop.launch",
                    "--spec", str(spec), "--out", str(out)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return float(first["time"]) - t0


# Runs that failed after their first step (gloo's teardown in torch 2.13 sometimes aborts a
# rank at exit: "terminate called without an active exception"); reported with the figures.
TEARDOWN_FAILURES: list[str] = []


def run_torchrun_script(work: Path, i: int) -> float:
    first = work / f"torchrun-script-{i}.first"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHYARD_")}
    env.update(FIRST_STEP_FILE=str(first), OMP_NUM_THREADS="1")
    from workers.host.env import free_port

    log = work / f"torchrun-script-{i}.log"
    t0 = time.time()
    with open(log, "wb") as out:
        proc = subprocess.run([*_torchrun(), "--nnodes=1", "--nproc_per_node=2",
                               f"--master_port={free_port()}", "train.py"], cwd=SCRIPT_DIR,
                              env=env, check=False, stdout=out, stderr=subprocess.STDOUT)
    if not first.exists():
        raise RuntimeError(f"torchrun never stepped (exit {proc.returncode}); see {log}")
    if proc.returncode:
        # The first step is what is timed; a failure after it is counted, not hidden.
        TEARDOWN_FAILURES.append(f"torchrun #{i}: exit {proc.returncode} after its first step")
        print(TEARDOWN_FAILURES[-1], flush=True)
    return float(first.read_text()) - t0


# -- Ray Train --------------------------------------------------------------------------------
def _ray_train_loop(config: dict[str, Any]) -> None:
    import ray.train

    from orchestrator.spec import parse_spec
    from workers.host.env import DistEnv
    from workers.loop.train import run_training

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    marker = Path(config["marker"])

    class FirstStep:
        def on_step(self, metrics: dict[str, Any]) -> None:
            if rank == 0 and not marker.exists():
                marker.write_text(str(metrics["time"]))

        def on_heartbeat(self, hb: Any) -> None:
            pass

        def on_log(self, level: str, message: str) -> None:
            pass

    env = DistEnv(rank=rank, local_rank=ctx.get_local_rank(), world_size=ctx.get_world_size(),
                  local_world_size=ctx.get_local_world_size(), master_addr="127.0.0.1",
                  master_port=0)  # Ray Train already created the process group
    run_training(parse_spec(config["spec"]), out_dir=config["out"], callbacks=FirstStep(),
                 dist_env=env)


def run_ray_train(work: Path, i: int) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    marker = work / f"raytrain-{i}.first"
    trainer = TorchTrainer(
        _ray_train_loop,
        train_loop_config={"spec": bench_spec(), "marker": str(marker),
                           "out": str(work / f"raytrain-{i}")},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(work / "ray_results"), name=f"startup-{i}"))
    t0 = time.time()
    trainer.fit()
    return float(marker.read_text()) - t0


# -- meshyard --------------------------------------------------------------------------------
class Service:
    """The meshyard API + runtime in this process, on the already running local Ray."""

    def __init__(self, work: Path, *, warm_pool: int | None) -> None:
        import uvicorn

        from api.app import create_app
        from api.server import bind_socket
        from orchestrator.runtime.service import Runtime
        from orchestrator.settings import Settings
        from orchestrator.store import open_store

        data = work / f"meshyard-pool-{'default' if warm_pool is None else warm_pool}"
        data.mkdir()
        self.settings = Settings(data_dir=data)
        self.store = open_store(self.settings.resolved_database_url)
        self.token = self.store.create_token("bench", admin=True)
        self.runtime = Runtime(self.settings, self.store, warm_pool=warm_pool)
        app = create_app(self.settings, store=self.store, runtime=self.runtime)
        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def run_job(self, i: int) -> float:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"}
        t0 = time.time()
        r = httpx.post(f"{self.url}/v1/jobs", json=dict(bench_spec(), name=f"startup-{i}"),
                       headers=headers, timeout=30)
        r.raise_for_status()
        job_id = r.json()["job"]["id"] if "job" in r.json() else r.json()["id"]
        return self._first_step(job_id, t0)

    def run_script_job(self, i: int) -> float:
        """`meshyard submit bench/byo/spec.yaml --working-dir bench/byo`, to the first report."""
        from api.client import MeshyardClient

        spec = dict(yaml.safe_load((SCRIPT_DIR / "spec.yaml").read_text()), name=f"script-{i}")
        t0 = time.time()
        with MeshyardClient(self.url, self.token) as client:
            job = client.submit_with_code(spec, working_dir=SCRIPT_DIR)
        return self._first_step(job.id, t0)

    def _first_step(self, job_id: str, t0: float) -> float:
        first = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            job = self.store.get_job(job_id)
            if first is None:
                points = self.store.list_metrics(job_id, rank=0, limit=1)
                first = points[0].time if points else None
            if job is not None and job.state.terminal:
                break
            time.sleep(0.05)
        if first is None:
            raise RuntimeError(f"{job_id} never stepped: {job}")
        if job is None or job.state.value != "SUCCEEDED":
            TEARDOWN_FAILURES.append(f"{job_id}: {job.state.value if job else None} after "
                                     f"its first step ({job.message if job else ''})"[:300])
            print(TEARDOWN_FAILURES[-1], flush=True)
        return first - t0

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.store.close()


def _pool_idle_mib(service: Service) -> dict[str, float]:
    """Resident memory the idle pool holds per node (actors and their prestarted ranks)."""
    status = service.runtime.pool_status(max_age_s=0) or {}
    return {node[:12]: round(r["idle_rss_bytes"] / 2**20, 1)
            for node, r in (status.get("nodes") or {}).items()}


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "startup.json"))
    ap.add_argument("--skip-ray-train", action="store_true")
    ap.add_argument("--only-script", action="store_true",
                    help="only the user-code rows (script job vs torchrun on the script)")
    args = ap.parse_args()
    if args.only_script:
        return script_rows(args)
    import ray

    work = Path(tempfile.mkdtemp(prefix="meshyard-startup-"))
    results: dict[str, list[float]] = {"torchrun": [], "ray_train": [], "meshyard_cold": [],
                                       "meshyard_warm": []}
    idle_mib: dict[str, float] = {}
    for i in range(args.repeats):
        results["torchrun"].append(run_torchrun(work, i))
        print(f"torchrun #{i}: {results['torchrun'][-1]:.2f} s", flush=True)
    t0 = time.perf_counter()
    # Ray Train wants the dashboard (state API); 4 logical CPUs so both peers fit side by side.
    ray.init(address="local", num_cpus=4, include_dashboard=not args.skip_ray_train,
             namespace="meshyard", log_to_driver=False)
    ray_start = time.perf_counter() - t0
    # Cold: every job starts fresh workers (warm_pool=0). Warm: the default settings, whose
    # warm pool is on (2 per CPU node on the embedded Ray).
    for pool, key in ((0, "meshyard_cold"), (None, "meshyard_warm")):
        service = Service(work, warm_pool=pool)
        try:
            if service.runtime.warm_pool:
                service.runtime.wait_for_pool(timeout_s=120)
                idle_mib = _pool_idle_mib(service)
            for i in range(args.repeats):
                results[key].append(service.run_job(i))
                print(f"{key} #{i}: {results[key][-1]:.2f} s", flush=True)
        finally:
            service.close()
    if not args.skip_ray_train:
        for i in range(args.repeats):
            results["ray_train"].append(run_ray_train(work, i))
            print(f"ray_train #{i}: {results['ray_train'][-1]:.2f} s", flush=True)
    ray.shutdown()
    med = {k: _median(v) for k, v in results.items() if v}
    summary: dict[str, Any] = {"median_s": med, "runs_s": results, "repeats": args.repeats,
                               "local_ray_init_s": round(ray_start, 2),
                               "load_avg": os.getloadavg(), "spec": str(SPEC_FILE),
                               "warm_pool_idle_mib_per_node": idle_mib}
    if "ray_train" in med:
        summary["cold_vs_ray_train"] = round(med["meshyard_cold"] / med["ray_train"], 3)
        summary["warm_vs_ray_train"] = round(med["meshyard_warm"] / med["ray_train"], 3)
    summary["cold_vs_torchrun"] = round(med["meshyard_cold"] / med["torchrun"], 3)
    summary["warm_vs_torchrun"] = round(med["meshyard_warm"] / med["torchrun"], 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


SPACED_S = 8.0


def script_rows(args: argparse.Namespace) -> int:
    """Submit -> first report of a script job (cold, and from the default settings' warm
    pool) vs torchrun on the same script; merged into the results file under `script`."""
    import ray

    work = Path(tempfile.mkdtemp(prefix="meshyard-startup-script-"))
    runs: dict[str, list[float]] = {"torchrun_script": [], "meshyard_script_cold": [],
                                    "meshyard_script_warm": [],
                                    "meshyard_script_warm_spaced": []}
    for i in range(args.repeats):
        runs["torchrun_script"].append(run_torchrun_script(work, i))
        print(f"torchrun script #{i}: {runs['torchrun_script'][-1]:.2f} s", flush=True)
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="meshyard",
             log_to_driver=False)  # a new local Ray, never a neighbour's
    # Cold: fresh worker actors, each starting its rank process. Warm: the default settings
    # (pooled actors with a prestarted rank process each, meshyard/_prestart.py).
    for pool, key in ((0, "meshyard_script_cold"), (None, "meshyard_script_warm")):
        service = Service(work, warm_pool=pool)
        try:
            if service.runtime.warm_pool:
                service.runtime.wait_for_pool(timeout_s=120)
            for i in range(args.repeats):
                runs[key].append(service.run_script_job(i))
                print(f"{key} #{i}: {runs[key][-1]:.2f} s", flush=True)
            if service.runtime.warm_pool:
                # Back to back (above), a job gets the actors the previous one handed back,
                # whose next prestarted rank process is still importing torch. Spaced, it
                # gets them ready: SPACED_S is several times that import on an idle core.
                spaced = "meshyard_script_warm_spaced"
                for i in range(args.repeats):
                    time.sleep(SPACED_S)
                    runs[spaced].append(service.run_script_job(args.repeats + i))
                    print(f"{spaced} #{i}: {runs[spaced][-1]:.2f} s", flush=True)
        finally:
            service.close()
    ray.shutdown()
    med = {k: _median(v) for k, v in runs.items()}
    out = Path(args.out)
    summary = json.loads(out.read_text()) if out.exists() else {}
    summary["script"] = {"median_s": med, "runs_s": runs, "repeats": args.repeats,
                         "load_avg": os.getloadavg(), "script": "bench/byo/train.py",
                         "cold_vs_torchrun": round(med["meshyard_script_cold"]
                                                   / med["torchrun_script"], 3),
                         "warm_vs_torchrun": round(med["meshyard_script_warm"]
                                                   / med["torchrun_script"], 3),
                         "warm_spaced_vs_torchrun": round(
                             med["meshyard_script_warm_spaced"] / med["torchrun_script"], 3),
                         "spaced_s": SPACED_S,
                         "failed_after_first_step": TEARDOWN_FAILURES}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["script"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
