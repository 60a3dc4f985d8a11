"""torchrun entry point.

    torchrun --nproc_per_node=N -m workers.loop.launch --spec SPEC.yaml --out DIR \
        [--steps K] [--seed S]
    python -m workers.loop.launch --spec SPEC.yaml --out DIR --reference

Writes ``DIR/metrics.jsonl`` (rank 0), ``DIR/heartbeats/rank_<r>.json``, ``DIR/logs/`` and
checkpoints under ``DIR/checkpoints``. ``--spec`` may be repeated: the specs then run one
after another in the same processes and process group (same world size required), each into
``DIR/<spec file stem>/`` — tests use this to share one launch across several checks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.admission.documents import parse_spec_text
from orchestrator.spec import JobSpec, SpecValidationError


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="workers.loop.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", action="append", required=True, help="JobSpec YAML/JSON file")
    ap.add_argument("--out", required=True, help="run directory")
    ap.add_argument("--steps", type=int, default=None, help="override training.steps")
    ap.add_argument("--seed", type=int, default=None, help="override training.seed")
    ap.add_argument("--reference", action="store_true",
                    help="single process, same global batch, no parallelism (parity baseline)")
    ap.add_argument("--checkpoint-dir", default=None,
                    help="checkpoint directory (default DIR/checkpoints); resumes from it")
    ap.add_argument("--attempt", type=int, default=1, help="attempt number (fault injection)")
    ap.add_argument("--heartbeat-interval", type=float, default=1.0)
    return ap.parse_args(argv)


def load_spec(path: str | Path) -> JobSpec:
    p = Path(path)
    kind = "application/json" if p.suffix == ".json" else "application/yaml"
    return parse_spec_text(p.read_text(), content_type=kind)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        specs = [(Path(s), load_spec(s)) for s in args.spec]
    except SpecValidationError as exc:
        print(f"invalid spec: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    shared_pg = len(specs) > 1 and not args.reference
    if shared_pg:
        _init_shared_group(specs[0][1])
    try:
        for path, spec in specs:
            run_dir = out / path.stem if len(specs) > 1 else out
            _run_one(spec, run_dir=run_dir, args=args)
    finally:
        if shared_pg:
            import torch.distributed as dist

            dist.destroy_process_group()
    return 0


def _init_shared_group(spec: JobSpec) -> None:
    # One process group for several specs: run_training reuses an existing group and
    # leaves it alone, so re-creating it on torchrun's port between specs is avoided.
    from workers.host.env import DistEnv, init_distributed, select_device

    env = DistEnv.from_environ()
    init_distributed(spec, dist_env=env, device=select_device(spec, local_rank=env.local_rank))


def _run_one(spec: JobSpec, *, run_dir: Path, args: argparse.Namespace) -> None:
    # torch is imported only now so that `--help` and spec errors are instant.
    from workers.host.env import DistEnv, apply_env, debug_env
    from workers.loop.callbacks import FileCallbacks
    from workers.loop.train import run_training

    env = DistEnv.single() if args.reference else DistEnv.from_environ()
    run_dir.mkdir(parents=True, exist_ok=True)
    apply_env(debug_env(spec, run_dir=run_dir), run_dir=run_dir)
    cbs = FileCallbacks(run_dir, rank=env.rank)
    try:
        run_training(spec, out_dir=run_dir, callbacks=cbs, steps=args.steps, seed=args.seed,
                     dist_env=env, reference=args.reference, attempt=args.attempt,
                     checkpoint_dir=args.checkpoint_dir,
                     heartbeat_interval_s=args.heartbeat_interval)
    finally:
        cbs.close()


if __name__ == "__main__":
    sys.exit(main())
