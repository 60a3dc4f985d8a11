"""Where the built-in loop's per-step CPU goes, next to a hand-written DDP step, in one process.

    .venv/bin/python bench/step_profile.py [--steps 40] [--reps 400]

Runs under torchrun (2 ranks on gloo, ``OMP_NUM_THREADS=1``; the script launches it itself)
on bench/throughput.py's model and DDP config. Two parts, both on rank 0, CPU time
(``time.process_time()``: every thread of the rank, gloo's included):

* paired steps: blocks of 16 real loop steps (``workers.loop.train._one_step`` + the metrics
  callback + the checkpoint check, as ``_train`` runs them) alternate with blocks of the
  hand-written step (bench/ddp_baseline.py's body) on the same DDP model and optimizer, so
  load on a shared machine hits both alike; the figure is the median per-step difference;
* components: each piece of the loop's own bookkeeping timed alone over ``--reps`` calls
  (phase changes, the collective settle, the step announcement, the loss/stop all-reduce,
  clipping, the metrics row and its callbacks, the heartbeat).

Writes bench/results/step_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Steps per paired block: a multiple of every sync interval the loop picks at this step time
# (workers/loop/stepsync.py), so each block holds its share of sync steps.
BLOCK = 16
RESULTS = REPO / "bench" / "results" / "step_profile.json"
sys.path.insert(0, str(REPO))


def _cpu_per_call(fn: Callable[[], Any], reps: int) -> float:
    """Median over 5 batches of CPU seconds per call."""
    per = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        per.append((time.process_time() - t0) / reps)
    return statistics.median(per)


def _sections(run: Any, *, model: Any, gen: Any, shape: tuple[int, int, int], device: Any,
              step0: int, blocks: int) -> dict[str, dict[str, float]]:
    """Median CPU seconds of each section of both steps, timed inside the step (the
    meshyard sections follow workers.loop.train._one_step line by line)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    from workers.loop import train as loop
    from workers.loop.callbacks import Phase
    from workers.loop.stepsync import StepSync

    b, t, v = shape
    mesh: dict[str, list[float]] = {}
    hand: dict[str, list[float]] = {}

    def lap(into: dict[str, list[float]], name: str, t0: float) -> float:
        now = time.process_time()
        into.setdefault(name, []).append(now - t0)
        return now

    step = step0
    for _ in range(blocks * BLOCK):
        step += 1
        c = time.process_time()
        run.progress.enter(Phase.DATA, step)
        loop._settle(run)
        c = lap(mesh, "settle_step_start", c)
        run.faults.before_step(step)
        batches = run.data.batches(step)
        c = lap(mesh, "data", c)
        loss = run.runner.train_step(batches, step=step, progress=run.progress)
        c = lap(mesh, "forward_backward", c)
        run.progress.enter(Phase.OPTIMIZER)
        loop._settle(run)
        c = lap(mesh, "settle_after_backward", c)
        one = StepSync(world=run.world, device=run.device, faults=run.faults)
        one.add({"step_time_s": 0.05}, loss)
        loss_value = one.flush(step, stop=False)[0][0]["loss"]
        c = lap(mesh, "loss_reduce", c)
        run.runner.clip_grad_norm(1.0)
        c = lap(mesh, "clip", c)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        c = lap(mesh, "optimizer", c)
        _ = {"lr": loop._current_lr(run.optimizer), "loss": loss_value, "time": time.time()}
        run.callbacks.on_step(_)
        lap(mesh, "metrics", c)

        c = time.process_time()
        rows = torch.randint(0, v, (b, t + 1), generator=gen).to(device)
        c = lap(hand, "data", c)
        loss = F.cross_entropy(model(rows[:, :-1]).reshape(-1, v).float(),
                               rows[:, 1:].reshape(-1))
        loss.backward()
        c = lap(hand, "forward_backward", c)
        loss.item()
        c = lap(hand, "loss_reduce", c)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        c = lap(hand, "clip", c)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        lap(hand, "optimizer", c)
    return {"meshyard": {k: statistics.median(x) for k, x in mesh.items()},
            "hand": {k: statistics.median(x) for k, x in hand.items()}}


def _worker(args: argparse.Namespace) -> None:  # noqa: PLR0915 - one linear measurement
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812

    from bench.throughput import GLOBAL_BATCH, spec_for
    from orchestrator.mesh import MeshShape
    from orchestrator.spec import JobSpec
    from workers.host.actor import _ActorCallbacks, _Buffer
    from workers.host.env import DistEnv, apply_env, debug_env, init_distributed, select_device
    from workers.host.evidence import announce_step_collective
    from workers.loop import train as loop
    from workers.loop.callbacks import FileCallbacks, Phase
    from workers.loop.checkpoint import Checkpointer
    from workers.loop.heartbeat import Progress, make_heartbeat
    from workers.loop.model import build_model
    from workers.loop.stepsync import StepSync

    work = Path(args.work)
    spec = JobSpec.model_validate(spec_for("ddp", steps=10_000, device="cpu"))
    env = DistEnv.from_environ()
    run_dir = work / "run"
    apply_env(debug_env(spec, run_dir=run_dir), run_dir=run_dir)  # Flight Recorder on
    os.environ["MESHYARD_RUN_DIR"] = str(run_dir)  # as in a worker actor: announcements on
    built = build_model(spec, seed=0)
    device = select_device(spec, local_rank=env.local_rank)
    init_distributed(spec, dist_env=env, device=device)
    progress = Progress()
    cbs = FileCallbacks(run_dir, rank=env.rank)
    run = loop._setup(spec, built=built, dims=MeshShape.from_parallelism(spec.parallelism),
                      env=env, device=device, seed=0, reference=False, progress=progress,
                      callbacks=cbs, attempt=1, preflight_links={})
    ckpt = Checkpointer(spec, root=run_dir / "checkpoints", parts=run.runner.model_parts,
                        optimizer=run.optimizer, rank=env.rank)
    model = run.runner.model_parts[0]
    gen = torch.Generator().manual_seed(env.rank)
    b, t, v = GLOBAL_BATCH // env.world_size, built.seq_len, built.vocab_size

    sync = StepSync(world=run.world, device=device, faults=run.faults)
    state = {"settle_first": True}

    def meshyard_step(step: int) -> None:  # workers.loop.train._train's body, checkpoint off
        row, loss = loop._one_step(run, step, settle_first=state["settle_first"])
        sync.add(row, loss)
        synced = sync.due(step, first=False, last=False)
        if synced:
            rows, _ = sync.flush(step, stop=False)
            for r in rows:
                cbs.on_step(r)
        progress.enter(Phase.CHECKPOINT)
        saved = ckpt.maybe_save(step)
        state["settle_first"] = synced or saved or run.clip_communicates

    def hand_step(step: int) -> None:
        rows = torch.randint(0, v, (b, t + 1), generator=gen).to(device)
        loss = F.cross_entropy(model(rows[:, :-1]).reshape(-1, v).float(),
                               rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        loss.item()

    step = 0
    for _ in range(5):  # warm-up
        step += 1
        meshyard_step(step)
        hand_step(step)
    diffs, mesh_cpu, hand_cpu = [], [], []
    for _ in range(args.steps):
        per = {}
        for name, fn in (("meshyard", meshyard_step), ("hand", hand_step)):
            dist.barrier()
            t0 = time.process_time()
            for _ in range(BLOCK):
                step += 1
                fn(step)
            per[name] = (time.process_time() - t0) / BLOCK
        diffs.append(per["meshyard"] - per["hand"])
        mesh_cpu.append(per["meshyard"])
        hand_cpu.append(per["hand"])

    sections = _sections(run, model=model, gen=gen, shape=(b, t, v), device=device,
                         step0=step, blocks=args.steps)
    reps = args.reps
    comp: dict[str, float] = {}
    raw = torch.zeros(3)
    dist.barrier()
    comp["bare_allreduce_3"] = _cpu_per_call(lambda: dist.all_reduce(raw), reps)
    dist.barrier()
    comp["phase_change_x5"] = 5 * _cpu_per_call(lambda: progress.enter(Phase.FORWARD, 1), reps)
    comp["settle_x2"] = 2 * _cpu_per_call(progress.settle_collectives, reps)
    vals = torch.zeros(3)
    comp["announce"] = _cpu_per_call(lambda: announce_step_collective("all_reduce", vals), reps)
    loss_t = torch.tensor(2.0)
    dist.barrier()

    def one_sync() -> None:
        one = StepSync(world=run.world, device=device, faults=run.faults)
        one.add({"step_time_s": 0.05}, loss_t)
        one.flush(1, stop=False)

    comp["loss_allreduce"] = _cpu_per_call(one_sync, reps)
    dist.barrier()
    comp["item_baseline"] = _cpu_per_call(lambda: loss_t.item(), reps)
    params = list(model.parameters())
    comp["clip_meshyard"] = _cpu_per_call(lambda: run.runner.clip_grad_norm(1.0), reps)
    comp["clip_torch"] = _cpu_per_call(
        lambda: torch.nn.utils.clip_grad_norm_(params, 1.0), reps)
    comp["data_meshyard"] = _cpu_per_call(lambda: run.data.batches(7), reps)
    comp["data_hand"] = _cpu_per_call(
        lambda: torch.randint(0, v, (b, t + 1), generator=gen).to(device), reps)
    row = {"step": 1, "loss": 2.0, "time": time.time(), "step_time_s": 0.05,
           "tokens_per_s": 1e4, "grad_norm": 1.0, "lr": 3e-3}
    comp["lr_read"] = _cpu_per_call(lambda: loop._current_lr(run.optimizer), reps)
    comp["metrics_file_cb"] = _cpu_per_call(lambda: cbs.on_step(row), reps)
    # The worker actor keeps each row in its run-dir file: when the step is done (no loss
    # yet) and in full at the sync.
    buf = _Buffer(rank=env.rank, metrics_file=run_dir / "actor.metrics.jsonl")
    acb = _ActorCallbacks(buf, run_dir / "actor.log")
    comp["metrics_actor_cb"] = _cpu_per_call(lambda: acb.on_step(row), reps)
    pending = {k: v for k, v in row.items() if k != "loss"}
    comp["pending_row_actor_cb"] = _cpu_per_call(lambda: acb.on_step_pending(pending), reps)
    comp["heartbeat_make"] = _cpu_per_call(lambda: make_heartbeat(progress, rank=0), reps)
    hb = make_heartbeat(progress, rank=0)
    comp["heartbeat_file_cb"] = _cpu_per_call(lambda: cbs.on_heartbeat(hb), reps)
    comp["heartbeat_actor_cb"] = _cpu_per_call(lambda: acb.on_heartbeat(hb), reps)
    comp["checkpoint_check"] = _cpu_per_call(lambda: ckpt.maybe_save(3), reps)
    dist.barrier()
    if env.rank == 0:
        out = {"steps_paired": args.steps * BLOCK, "sync_interval": sync.interval,
               "reps": reps,
               "cpu_s_per_step": {"meshyard": statistics.median(mesh_cpu),
                                  "hand": statistics.median(hand_cpu)},
               "overhead_cpu_s_per_step": statistics.median(diffs),
               "overhead_cpu_s_per_step_mean": statistics.mean(diffs),
               "ratio_cpu_hand_over_meshyard": statistics.median(
                   h / m for h, m in zip(hand_cpu, mesh_cpu, strict=True)),
               "components_cpu_s": comp, "sections_cpu_s": sections,
               "load_average": os.getloadavg()}
        Path(args.out).write_text(json.dumps(out, indent=2))
    cbs.close()
    buf.close()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="paired blocks of BLOCK steps each")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    from workers.host.env import free_port

    work = Path(tempfile.mkdtemp(prefix="meshyard-step-profile-"))
    out = work / "profile.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", __file__, "--worker",
           f"--work={work}", f"--out={out}", f"--steps={args.steps}", f"--reps={args.reps}"]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=900)
    result = json.loads(out.read_text())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
