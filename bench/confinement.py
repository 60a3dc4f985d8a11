"""What confining a rank process costs its start (isolated mode, meshyard/_confine.py).

Two measurements, interleaved so that both sides see the same machine:

1. `apply`: a forked child confines itself with a realistic plan (Ray's ports and the
   control plane's closed, the data dir, Ray's temp dir and token hidden, the run dir and a
   code dir bound back) against a forked child that does nothing; per step too
   (namespaces + mounts, capabilities, the file layer, the TCP layer).
2. `start`: the cold start of a rank process as the worker does it
   (workers/host/rankproc.RankProcess, `python -c pass` through a fork-exec), confined and not,
   to its exit.

The TCP layer's ruleset (one rule per open port, ~65,000) is built once per worker and
reused; its build time is reported apart. Writes bench/results/confinement.json.

    .venv/bin/python bench/confinement.py [--rounds 20] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshyard import _confine  # noqa: E402
from workers.host.rankproc import Confinement, RankProcess  # noqa: E402

RAY_PORTS = (*range(10002, 20000), 8265, 8470, 10001, 44217, 44227, 52365)


def _plan(root: Path) -> _confine.Plan:
    data, ray = root / "data", root / "ray"
    run, code = data / "runs" / "job-1", ray / "session_x" / "runtime_resources" / "code"
    for d in (run / "tmp", code, data / "datasets", Path.home() / ".ray"):
        d.mkdir(parents=True, exist_ok=True)
    return _confine.Plan(run_dir=str(run), tmp_dir=str(run / "tmp"), code_dirs=(str(code),),
                         hide=(str(data), str(ray), str(Path.home() / ".ray"), "/etc/shadow"),
                         denied_ports=RAY_PORTS)


def _child(fn: object) -> float:
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fn()  # type: ignore[operator]
        os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def _steps(plan: _confine.Plan, net_fd: int) -> dict[str, float]:
    """One child's time per step (printed back through a pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        t = [time.perf_counter()]
        _confine._enter_namespaces()
        _confine._mounts(plan, _confine.Report())
        t.append(time.perf_counter())
        _confine.drop_capabilities()
        t.append(time.perf_counter())
        with _confine._file_ruleset(plan) as files:
            files.restrict()
        t.append(time.perf_counter())
        _confine.ll.Ruleset.adopt(net_fd).restrict()
        t.append(time.perf_counter())
        names = ("namespaces_and_mounts", "capabilities", "file_layer", "tcp_layer")
        spans = [b - a for a, b in zip(t, t[1:], strict=False)]
        os.write(write, json.dumps(dict(zip(names, spans, strict=True))).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "confinement.json"))
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="meshyard-bench-confine-"))
    plan = _plan(root)
    t0 = time.perf_counter()
    layer = _confine.port_ruleset(plan.denied_ports)
    build_s = time.perf_counter() - t0
    assert layer.fd is not None
    confine = Confinement(plan=plan, net_fd=layer.fd)
    apply_s, bare_s, cold_s, plain_s, steps = [], [], [], [], []
    argv = [sys.executable, "-c", "pass"]
    for _ in range(args.rounds):
        bare_s.append(_child(lambda: None))
        apply_s.append(_child(lambda: _confine.apply(plan, net_fd=confine.net_fd)))
        steps.append(_steps(plan, confine.net_fd))
        for out, conf in ((plain_s, None), (cold_s, confine)):
            t = time.perf_counter()
            proc = RankProcess(argv, env=dict(os.environ), cwd=str(root), confine=conf).start()
            proc.wait(60)
            out.append(time.perf_counter() - t)
    med = statistics.median
    result = {
        "rounds": args.rounds, "load_average": os.getloadavg()[0],
        "denied_ports": len(plan.denied_ports),
        "tcp_layer_build_s": build_s,
        "fork_only_s": med(bare_s), "fork_and_confine_s": med(apply_s),
        "confine_cost_s": med(apply_s) - med(bare_s),
        "steps_s": {k: med(s[k] for s in steps) for k in steps[0]},
        "cold_start_plain_s": med(plain_s), "cold_start_confined_s": med(cold_s),
        "cold_start_ratio": med(cold_s) / med(plain_s),
        "cold_start_added_s": med(cold_s) - med(plain_s),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
