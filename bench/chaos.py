"""Faults on the lab (deploy/lab): each kind injected mid-training on a real multi-host Ray
cluster of network-namespace hosts, and what meshyard did, timed.

Lab: three Ray hosts and a control-plane host (`meshyard serve`, its checkpoints on the lab's
object store, an S3-compatible server on that host), brought up once. Job: a 2-rank built-in
GPT, one rank a host, a checkpoint every 10 steps, `max_failures: 1` (deploy/lab/jobs.py,
CHECKPOINTED). Each kind runs its own job, faults the host of rank 1 (the control plane's host
for `control_plane`; rank 1's host's own run-dir disk for `full_disk`) once both ranks are
past step 25, and restores the lab after.

Per kind, from the fault: the first stored event that explains it (a failure, a diagnosis, a
failed save) and its delay; whether it names the faulted host; the host's health after; the
next attempt placed (WORKERS_READY) and its first step; steps lost (steps the next attempt
did again: the last step of attempt 1 minus the step it resumed from) and metric rows lost
(rank 0's attempt-1 steps missing from the store); and beside it Ray's own time to declare the
host's node dead (a driver on the head polling `ray.nodes()`), the peer figure for detection.
Goal (issue): the right verdict and host for every kind, fault -> next step under 60 s.

    sudo .venv/bin/python bench/chaos.py [--kinds host_crash,partition,...]
                                         [--out bench/results/chaos.json]

Kinds: host_crash (every process of the host killed -9), partition (its link down),
full_disk (rank 1's host's run-dir disk, where it writes its checkpoint part, filled to 100 %),
control_plane (`meshyard serve` killed -9 and started again on its host), flapping_link (link
down 5 s, then up), slow_link (the host's link shaped to 4 Mbit/s for 60 s: is it named as the
slow end? then a new job placed while it still is: is the host kept out?), slow_preflight
(rank 0's host shaped while no job runs, a new job placed: does its failed pre-flight check
name that host, not the sender of the slow p2p, and does the next attempt avoid it?). Needs
root and iproute2 (deploy/lab/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.lab import jobs as labjobs  # noqa: E402
from deploy.lab import lab as labmod  # noqa: E402
from deploy.lab.jobs import CHECKPOINTED, Watch, node_state, training  # noqa: E402
from orchestrator.lifecycle import FAILURE_REASONS  # noqa: E402

KINDS = ("host_crash", "partition", "full_disk", "control_plane", "flapping_link", "slow_link",
         "slow_preflight")
FAULT_AFTER_STEP = 25
FAILURES = {r.value for r in FAILURE_REASONS}

_RAY_WATCH = r"""
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
seen = {}
while True:
    for n in ray.nodes():
        ip, alive = n["NodeManagerAddress"], bool(n["Alive"])
        if seen.get(n["NodeID"]) != alive:
            seen[n["NodeID"]] = alive
            print(json.dumps({"t": time.time(), "ip": ip, "alive": alive}), flush=True)
    time.sleep(0.5)
"""


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def _explains(event: dict[str, Any], kind: str) -> bool:
    """An event that reports the fault: a failure, a hang or crash diagnosis, a failed save,
    a link gap, a slow link or a straggler report for a slow link. The control plane's own
    restart has none."""
    msg = event["message"]
    if kind == "control_plane":
        return False
    return (event["reason"] in FAILURES or event["reason"] in ("LINK_GAP", "SLOW_LINK")
            or (msg.startswith("diagnosis") and ("straggler" not in msg or kind == "slow_link"))
            or "was not saved" in msg)


def _ray_dead_s(lab: labmod.Lab, ip: str, since: float) -> float | None:
    path = lab.head.dir / "ray-watch.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("{"):
            x = json.loads(line)
            if x["ip"] == ip and not x["alive"] and x["t"] >= since:
                return round(x["t"] - since, 1)
    return None


def _rows(w: Watch) -> list[list[Any]]:
    return w.client("[[m.attempt, m.step] for m in c.metrics(JOB, rank=0).items]")


def _outcome(w: Watch, kind: str, victim: labmod.Host, t0: float, at_fault: int,
             *, restarts: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "host": victim.name, "step_at_fault": at_fault}
    late = [e for e in w.events() if _at(e) >= t0 - 1 and _explains(e, kind)]
    first = late[0] if late else None
    out["detected_s"] = round(_at(first) - t0, 1) if first else None
    for e in w.events():  # the timeline, for the reader of the run's output
        if _at(e) >= t0 - 1:
            print(f"  {kind} +{_at(e) - t0:6.1f} s {e['reason']}: {e['message'][:150]}",
                  flush=True)
    out["verdict"] = (f"{first['reason']}: {first['message'][:240]}" if first else None)
    out["host_named"] = any(victim.name in e["message"] for e in late)
    out["node_state"] = node_state(w, victim.name) if kind != "control_plane" else None
    if restarts:
        ready = next((e for e in w.events() if e["reason"] == "WORKERS_READY"
                      and _at(e) > t0), None)
        out["replaced_s"] = round(_at(ready) - t0, 1) if ready else None
    rows = _rows(w)
    one = sorted({s for a, s in rows if a == 1})
    two = sorted({s for a, s in rows if a == 2})
    out["rows_lost"] = len(set(range(1, max(one) + 1)) - set(one)) if one else None
    out["steps_lost"] = (max(one) - (min(two) - 1)) if one and two else 0
    return out


def _next_step_s(w: Watch, t0: float, attempt: int) -> float | None:
    try:
        w.wait(f"attempt {attempt} training", lambda w: training(w, attempt, 1), timeout=300)
    except AssertionError:
        return None
    first = next(x for x in w.states() if x["attempt"] == attempt and x["ranks"]
                 and all(r[3] == attempt and r[2] >= 1 for r in x["ranks"]))
    return round(first["t"] - t0, 1)


def run_slow_preflight(lab: labmod.Lab) -> dict[str, Any]:
    """Rank 0's host of a job (the receiver of the pre-flight check's p2p 1->0, which blames
    its sender) gets the slow link while no job runs; then a new job is placed: does the
    pre-flight check's measurement name that host, and does the next attempt avoid it?"""
    w = Watch(lab, "chaos-slow-preflight.log", CHECKPOINTED)
    ranks = w.wait("a job training", lambda w: training(w, 1, 3), timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 0))
    w.cancel()
    lab.slow_link(victim, "4mbit")
    try:
        return {"kind": "slow_preflight", "host": victim.name,
                "next_job": _placed_while_slow(lab, victim, log="chaos-slow-preflight-next.log")}
    finally:
        _restore(lab, "slow_link", victim)


def run_kind(lab: labmod.Lab, kind: str) -> dict[str, Any]:
    if kind == "slow_preflight":
        return run_slow_preflight(lab)
    w = Watch(lab, f"chaos-{kind}.log", CHECKPOINTED)
    ranks = w.wait("attempt 1 training", lambda w: training(w, 1, FAULT_AFTER_STEP),
                   timeout=300)
    victim = lab.host(next(r[1] for r in ranks if r[0] == 1))
    at_fault = max(r[2] for r in ranks)
    t0 = time.time()
    restarts = kind in ("host_crash", "partition", "full_disk")
    out: dict[str, Any]
    try:
        if kind == "host_crash":
            lab.kill_host(victim)
        elif kind == "partition":
            lab.link_down(victim)
        elif kind == "full_disk":
            lab.fill_disk(victim, labmod.RUN_DIR)
            w.wait("the failed save", lambda w: any("was not saved" in e["message"]
                                                    for e in w.events()), timeout=180)
            lab.free_disk(victim, labmod.RUN_DIR)
        elif kind == "control_plane":
            victim = labjobs.control_plane(lab)
            for pid in labjobs.serve_pids(lab):
                os.kill(pid, signal.SIGKILL)
            labjobs.start_serve(lab)  # returns once its port accepts connections
            serving_again = time.time() - t0
        elif kind == "flapping_link":
            lab.link_down(victim)
            time.sleep(5)
            lab.link_up(victim)
        elif kind == "slow_link":
            lab.slow_link(victim, "4mbit")
        if restarts:
            w.wait("the attempt's end", lambda w: any(
                e["reason"] in FAILURES and _at(e) >= t0 for e in w.events()),
                timeout=300)
            next_s = _next_step_s(w, t0, 2)
        else:
            time.sleep(60)  # what the kind does to a running attempt, if anything
            next_s = None
        out = _outcome(w, kind, victim, t0, at_fault, restarts=restarts)
        out["next_step_s"] = next_s
        out["restarted"] = (w.states()[-1]["attempt"] or 1) > 1
        out["ray_node_dead_s"] = _ray_dead_s(lab, victim.ip, t0)
        if kind == "control_plane":
            out["serving_again_s"] = round(serving_again, 1)
        w.cancel()
        if kind == "slow_link":  # the next job, placed while the link is still slow
            out["next_job"] = _placed_while_slow(lab, victim)
    finally:
        _restore(lab, kind, victim)
    return out


def _placed_while_slow(lab: labmod.Lab, victim: labmod.Host, *,
                       log: str = "chaos-slow-next.log") -> dict[str, Any]:
    """A new job while the victim's link is slow: does the pre-flight check refuse it?"""
    w = Watch(lab, log, CHECKPOINTED)
    t0 = time.time()
    try:
        ranks = w.wait("the next job training or ended", lambda w: w.ended() or (training(
            w, w.states()[-1]["attempt"] or 1, 3) if w.states() else None), timeout=300)
        pre = [e for e in w.events() if e["reason"] == "PREFLIGHT_FAILED"
               and e["kind"] == "error"]
        out = {"preflight_failed": [e["message"][:1500] for e in pre],
               "victim_named": any(victim.name in e["message"] for e in pre),
               "ended": w.ended()}
        if isinstance(ranks, list):
            out |= {"trains_on": sorted({r[1] for r in ranks}),
                    "victim_used": victim.name in {r[1] for r in ranks},
                    "attempt": w.states()[-1]["attempt"],
                    "training_s": round(time.time() - t0, 1)}
        return out
    finally:
        w.cancel()


def _restore(lab: labmod.Lab, kind: str, victim: labmod.Host) -> None:
    if kind == "partition" or kind == "flapping_link":
        lab.link_up(victim)
    if kind == "slow_link":
        lab.slow_link(victim, None)
    if kind in ("host_crash", "partition"):
        lab.kill_host(victim)  # Ray declared the node dead; started again, as an operator would
        lab.start_ray(victim)
    lab.wait_nodes(len(lab.hosts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "chaos.json"))
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        ap.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    why = labmod.lab_available()
    if why:
        print(f"chaos: the lab cannot run here: {why}", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    lab = labjobs.up(3)
    try:
        lab.spawn_in(lab.head, [sys.executable, "-c", _RAY_WATCH, lab.ray_address],
                     log="ray-watch.log")
        for kind in kinds:
            t = time.time()
            try:
                res = run_kind(lab, kind)
            except Exception as exc:  # noqa: BLE001 - reported in the results, next kind runs
                res = {"kind": kind, "error": f"{type(exc).__name__}: {str(exc)[:600]}"}
            res["wall_s"] = round(time.time() - t, 1)
            results.append(res)
            print(json.dumps(res), flush=True)
    finally:
        left = labmod.down()
    doc = {"when": datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count(),
           "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0]},
           "results": results, "lab_left": left}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
