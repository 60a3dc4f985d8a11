"""Hang diagnosis: the fault table through the real runtime, verdicts and latency.

Each scenario is a tiny gloo job on a local Ray (3 ranks; 2 for the pipeline and user-code
cases) with one injected fault. Per scenario it prints the stored verdict and culprit ranks,
whether both are right, and the time from injection to the stored report. Two settings:

  * `fast`:     watchdog.stall_timeout_s = 3 (target: report < 10 s after the injection);
  * `defaults`: no watchdog block, the adaptive thresholds (max(12 s, 5 x p95 step time);
                target < 30 s).

Injection time = when the last healthy step before the fault completed (the fault fires at the
start of the next step, or at its loss all-reduce a few ms later), from the workers' metrics.
Report time = when the control plane stored the report. For the straggler case the report
comes from the periodic time-to-enter probe (every 5 s of progress), not from a stall.

The `script_*` scenarios run a user's own script instead of the built-in loop
(tests/integration/watchdog/user_scripts/hangs.py: plain torch.distributed, no meshyard
import, uploaded as a code package): the probe inside each rank process supplies progress
(collective seqs) and evidence, and the report names the user's source line. Their
injection time is the time the script prints when it reaches its fault.

The peer is PyTorch itself: without a watchdog a hung job sits until its collective timeout
(gloo default 30 min, NCCL 10 min; this job's `collective_timeout_s` is 60 s here) and then
fails with a timeout that names no culprit.

    .venv/bin/python bench/hang.py [--config fast|defaults|both] [--only hang,crash]
                                   [--out bench/results/hang.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STEP = 3  # the fault fires at this step
TINY = {"kind": "gpt", "n_layers": 2, "n_heads": 2, "d_model": 32, "vocab_size": 64,
        "seq_len": 16}

# name -> (fault, world, accepted verdicts, expected culprits, extra spec)
SCENARIOS: dict[str, tuple[dict[str, Any] | None, int, set[str], list[int] | None,
                           dict[str, Any]]] = {
    "hang": ({"kind": "hang", "rank": 1}, 3, {"NOT_JOINED"}, [1], {}),
    "crash": ({"kind": "crash", "rank": 2}, 3, {"RANK_EXITED"}, [2], {}),
    "mismatch": ({"kind": "mismatch", "rank": 1}, 3, {"COLLECTIVE_MISMATCH"}, [1], {}),
    "desync": ({"kind": "desync", "rank": 0}, 3, {"NOT_JOINED", "COLLECTIVE_MISMATCH"}, [0],
               {}),
    "p2p_stall": ({"kind": "p2p_stall", "rank": 0}, 2, {"P2P_MISMATCH", "NOT_JOINED"}, [0],
                  {"parallelism": {"pp": 2, "pp_microbatches": 2}}),
    "user_hang": ({"kind": "user_hang", "rank": 0}, 2, {"NON_COLLECTIVE_HANG"}, [0, 1], {}),
    "slow": ({"kind": "slow", "rank": 2, "seconds": 0.3}, 3, {"STRAGGLER"}, [2],
             {"steps": 40}),
    "healthy": (None, 3, set(), None, {"steps": 30}),
}

USER_SCRIPTS = REPO / "tests" / "integration" / "watchdog" / "user_scripts"
# name -> (script scenario, culprit, world, accepted verdicts, expected culprits or None for
# "any one rank" (gloo aborts one side of a size mismatch), steps or None)
SCRIPT_SCENARIOS: dict[str, tuple[str, int, int, set[str], list[int] | None, int | None]] = {
    "script_not_joined": ("not_joined", 2, 3, {"NOT_JOINED"}, [2], None),
    "script_not_joined_0": ("not_joined", 0, 3, {"NOT_JOINED"}, [0], None),
    "script_exited": ("exited", 1, 3, {"RANK_EXITED"}, [1], None),
    "script_mismatch": ("mismatch", 1, 2, {"COLLECTIVE_MISMATCH", "RANK_EXITED"}, None, None),
    "script_p2p": ("p2p", 1, 3, {"P2P_MISMATCH"}, [1], None),
    "script_non_collective": ("non_collective", 0, 2, {"NON_COLLECTIVE_HANG"}, [0, 1], None),
    "script_straggler": ("straggler", 1, 3, {"STRAGGLER"}, [1], 120),
    "script_healthy": ("healthy", 0, 3, set(), [], 60),
}


def script_spec(name: str, config: str, package: str) -> dict[str, Any]:
    scenario, culprit, world, _, _, steps = SCRIPT_SCENARIOS[name]
    cmd = ["python", "hangs.py", scenario, str(culprit)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    hung = scenario not in ("straggler", "healthy")
    spec: dict[str, Any] = {
        "name": f"bench-hang-{name}-{config}".replace("_", "-"),
        "parallelism": {"dp_replicate": world},
        "resources": {"cpus_per_worker": 0.25, "device": "cpu"},
        "fault_tolerance": {"max_failures": 0, "init_timeout_s": 120,
                            "collective_timeout_s": 60},
        "entrypoint": {"command": cmd, "working_dir": package}}
    if config == "fast":
        spec["watchdog"] = {"stall_timeout_s": 3, "first_step_timeout_s": 120,
                            "action": "fail" if hung else "observe"}
    elif hung:
        spec["watchdog"] = {"action": "fail"}
    return spec


def ship_scripts(settings: Any) -> str:
    from api.packaging import build_package
    from orchestrator.usercode.entrypoint import package_ref
    from orchestrator.usercode.packages import PackageWriter

    local = build_package(USER_SCRIPTS, max_bytes=settings.max_package_bytes)
    writer = PackageWriter(settings.packages_dir, max_bytes=settings.max_package_bytes,
                           max_unpacked_bytes=8 * settings.max_package_bytes)
    writer.write(local.data)
    return package_ref(writer.finish().digest)


def _script_inject_time(runs: Path, job_id: str) -> float | None:
    import re

    marks = [float(m.group(1))
             for p in (runs / job_id / "logs" / "attempt-1").glob("rank-*.stdout")
             for m in re.finditer(r"reached the fault at ([0-9.]+)", p.read_text())]
    return min(marks) if marks else None


def spec_for(name: str, config: str) -> dict[str, Any]:
    fault, world, _, _, extra = SCENARIOS[name]
    steps = extra.get("steps", 12)
    spec: dict[str, Any] = {
        "name": f"bench-hang-{name}-{config}",
        "parallelism": extra.get("parallelism", {"dp_replicate": world}),
        "resources": {"cpus_per_worker": 0.25, "device": "cpu"},
        "model": dict(TINY),
        "training": {"steps": steps, "micro_batch_size": 2, "lr": 0.01},
        "checkpoint": {"enabled": False},
        "fault_tolerance": {"max_failures": 0, "init_timeout_s": 120,
                            "collective_timeout_s": 60},
    }
    hung = fault is not None and fault["kind"] != "slow"
    if config == "fast":
        spec["watchdog"] = {"stall_timeout_s": 3, "first_step_timeout_s": 120,
                            "action": "fail" if hung else "observe"}
    elif hung:
        spec["watchdog"] = {"action": "fail"}  # thresholds stay the adaptive defaults
    if fault is not None:
        spec["inject_fault"] = {**fault, "step": 2 if fault["kind"] == "slow" else STEP}
    return spec


def _terminal(store: Any, job_id: str, timeout_s: float) -> Any:
    from orchestrator.lifecycle import TERMINAL_STATES

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job.state in TERMINAL_STATES:
            return job
        time.sleep(0.25)
    return store.get_job(job_id)


def _inject_time(store: Any, job_id: str, name: str) -> float | None:
    fault = SCENARIOS[name][0]
    if fault is None:
        return None
    before = (2 if fault["kind"] == "slow" else STEP) - 1
    times = [float(m.time) for m in store.list_metrics(job_id) if m.step == before]
    return max(times) if times else None


def run_one(store: Any, name: str, config: str, *, cancel_after_s: float = 240.0,
            package: str = "", runs: Path | None = None) -> dict[str, Any]:
    from orchestrator.spec import parse_spec

    script = name in SCRIPT_SCENARIOS
    if script:
        _, _, _, verdicts, culprits, _ = SCRIPT_SCENARIOS[name]
        spec = script_spec(name, config, package)
    else:
        _, _, verdicts, culprits, _ = SCENARIOS[name]
        spec = spec_for(name, config)
    job, _ = store.submit_job(parse_spec(spec), owner="admin")
    job = _terminal(store, job.id, cancel_after_s)
    if job.state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        store.request_cancel(job.id, viewer=None)
        job = _terminal(store, job.id, 30.0)
    diags = store.list_diagnoses(job.id)
    first = diags[0] if diags else None
    t_inj = _script_inject_time(runs, job.id) if script and runs else \
        None if script else _inject_time(store, job.id, name)
    latency = (first.created_at.timestamp() - t_inj) if first and t_inj else None
    got_v = first.verdict if first else None
    got_c = list(first.culprit_ranks) if first else None
    if script and not verdicts:
        right = not diags and str(job.state).endswith("SUCCEEDED")
    elif script and culprits is None:
        right = got_v in verdicts and got_c is not None and len(got_c) == 1
    else:
        right = (not diags) if culprits is None else (got_v in verdicts and got_c == culprits)
    return {"scenario": name, "config": config, "job": job.id, "state": str(job.state),
            "failure_reason": job.failure_reason, "verdict": got_v, "culprit_ranks": got_c,
            "expected_verdicts": sorted(verdicts), "expected_culprits": culprits,
            "right": right, "reports": len(diags),
            "inject_to_report_s": round(latency, 2) if latency is not None else None,
            "summary": first.summary if first else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=["fast", "defaults", "both"], default="both")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "hang.json"))
    ap.add_argument("--data-dir", default=None, help="keep the runs here (default: a temp dir)")
    args = ap.parse_args()
    every = [*SCENARIOS, *SCRIPT_SCENARIOS]
    names = [n for n in args.only.split(",") if n in every] if args.only else every
    configs = ["fast", "defaults"] if args.config == "both" else [args.config]

    import ray

    from orchestrator.runtime.service import Runtime
    from orchestrator.settings import Settings
    from orchestrator.store import open_store

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="meshyard-hang-") as scratch:
        tmp = args.data_dir or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
                 namespace="meshyard", _node_ip_address="127.0.0.1")
        store = open_store(f"sqlite:///{Path(tmp) / 'meshyard.db'}")
        settings = Settings(data_dir=Path(tmp), allow_fault_injection=True)
        rt = Runtime(settings, store, tick_s=0.2, warm_pool=3)
        rt.start()
        package = ship_scripts(settings)
        t0 = time.time()
        try:
            for config in configs:
                for name in names:
                    row = run_one(store, name, config, package=package,
                                  runs=settings.resolved_runs_dir)
                    rows.append(row)
                    lat = row["inject_to_report_s"]
                    print(f"{config:8} {name:21} {str(row['verdict']):20} "
                          f"{str(row['culprit_ranks']):9} right={row['right']!s:5} "
                          f"inject->report {('-' if lat is None else f'{lat:.1f} s'):>8}",
                          flush=True)
        finally:
            rt.stop()
            store.close()
            ray.shutdown()
    summary = {c: {"right": sum(r["right"] for r in rows if r["config"] == c),
                   "total": sum(1 for r in rows if r["config"] == c),
                   "max_inject_to_report_s": max(
                       (r["inject_to_report_s"] for r in rows
                        if r["config"] == c and r["inject_to_report_s"] is not None),
                       default=None)} for c in configs}
    out = {"rows": rows, "summary": summary, "wall_s": round(time.time() - t0, 1),
           "loadavg": os.getloadavg(), "targets_s": {"fast": 10, "defaults": 30}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
