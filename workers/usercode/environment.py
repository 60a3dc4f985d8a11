"""What a rank process of a user-code job runs: its argument list and its environment. Pure
module (no torch): the worker actor calls `rank_argv` and `rank_env`, then starts the process
(workers/host/rankproc.py).

Environment, on top of the worker's allowlisted one (orchestrator.isolation.worker_env): torchrun's
variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT =
attempt - 1, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID = job id), CUDA_VISIBLE_DEVICES =
the job's GPUs on this node in local-rank order (so `cuda:LOCAL_RANK` is the GPU the solver
chose and NCCL sees its NVLink peers), NCCL / Flight Recorder settings (workers.host.env.debug_env),
meshyard's own (meshyard._protocol), then the spec's `entrypoint.env`.

>>> rank_argv(Entrypoint(command=("python", "-u", "train.py", "--lr", "1")), python="/py")
['/py', '-u', '-m', 'meshyard.runner', 'script', 'train.py', '--lr', '1']
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from meshyard import _protocol as proto
from orchestrator.isolation.worker_env import allowlisted
from orchestrator.mesh import DIMS, MeshShape
from orchestrator.usercode.entrypoint import Entrypoint
from workers.host.assignment import RankAssignment

PYTHON_NAMES = ("python", "python3")
_FLAGS = frozenset({"-u", "-O", "-OO", "-B", "-b", "-bb", "-E", "-s", "-I", "-P", "-q", "-v"})
_FLAGS_WITH_ARG = frozenset({"-W", "-X"})
RUNNER = ("-m", "meshyard.runner")


def _python_argv(args: list[str], *, python: str) -> list[str]:
    """`python [opts] (script | -m mod | -c code) args` through the runner; anything else
    (a bare or unusual interpreter call) is exec'd as given after the runner's setup."""
    opts: list[str] = []
    i = 1
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        if flag in ("-m", "-c") and i + 1 < len(args):
            mode = "module" if flag == "-m" else "code"
            return [python, *opts, *RUNNER, mode, *args[i + 1:]]
        if flag in _FLAGS:
            opts.append(flag)
            i += 1
        elif flag in _FLAGS_WITH_ARG and i + 1 < len(args):
            opts += [flag, args[i + 1]]
            i += 2
        else:
            return [python, *RUNNER, "exec", python, *args[1:]]
    if i >= len(args):
        return [python, *RUNNER, "exec", python, *args[1:]]
    return [python, *opts, *RUNNER, "script", *args[i:]]


def rank_argv(ep: Entrypoint, *, python: str) -> list[str]:
    """The rank process's argv: always the runner (meshyard.runner) first."""
    if ep.function is not None:
        return [python, *RUNNER, "function", ep.function]
    assert ep.command is not None
    args = list(ep.command)
    if args[0] in PYTHON_NAMES or args[0] == python:
        return _python_argv(args, python=python)
    return [python, *RUNNER, "exec", *args]


def _pythonpath(code_dir: str, *, user: str | None, inherited: str | None,
                drop: str | None) -> str:
    parts = [code_dir, *(user or "").split(os.pathsep)]
    parts += [p for p in (inherited or "").split(os.pathsep)
              if p and (drop is None or Path(p) != Path(drop))]
    return os.pathsep.join(p for p in dict.fromkeys(parts) if p)


def rank_env(a: RankAssignment, *, base: Mapping[str, str], code_dir: str, report_file: str,
             debug: Mapping[str, str], parent_pid: int, function_config: str | None = None,
             runtime_root: str | None = None, probe_dir: str | None = None,
             confined: bool = False) -> dict[str, str]:
    """The whole environment of rank `a.rank`'s process. `base` is the worker's environment
    (only its allowlisted names are kept), `debug` the NCCL / Flight Recorder variables,
    `runtime_root` the directory Ray's working_dir put first on the worker's PYTHONPATH,
    `probe_dir` where the rank's probe (meshyard/_probe.py) meets the watchdog. `confined`
    (meshyard/_confine.py): no RAY_* variable (a token or an address), TMPDIR is the job's
    /tmp, and caches default there (the rest of the file system is read-only to the rank)."""
    spec, d = a.spec, a.dist
    ep = spec.entrypoint
    assert ep is not None
    mesh = MeshShape.from_parallelism(spec.parallelism)
    env = allowlisted(base)
    if confined:
        env = {k: v for k, v in env.items() if not k.startswith("RAY_")}
        env.update(TMPDIR="/tmp", XDG_CACHE_HOME="/tmp/.cache",
                   TRITON_CACHE_DIR="/tmp/.triton", TORCHINDUCTOR_CACHE_DIR="/tmp/.inductor")
    env.update(debug)
    env.update({
        "RANK": str(d.rank), "LOCAL_RANK": str(d.local_rank), "WORLD_SIZE": str(d.world_size),
        "LOCAL_WORLD_SIZE": str(d.local_world_size), "GROUP_RANK": str(a.node_rank),
        "GROUP_WORLD_SIZE": str(a.num_nodes), "ROLE_RANK": str(d.rank), "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(d.world_size), "MASTER_ADDR": d.master_addr,
        "MASTER_PORT": str(d.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(a.attempt - 1),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.fault_tolerance.max_failures),
        "TORCHELASTIC_RUN_ID": a.job_id,
        "PYTHONUNBUFFERED": "1",
        proto.JOB_ID: a.job_id, proto.ATTEMPT: str(a.attempt),
        proto.MESH_DIM_NAMES: ",".join(DIMS),
        proto.MESH_SHAPE: ",".join(str(s) for s in mesh.sizes),
        proto.ZERO_STAGE: str(spec.parallelism.effective_zero_stage()),
        **({proto.CHECKPOINT_REFUSED: a.checkpoints_refused} if a.checkpoints_refused else
           {proto.CHECKPOINT_DIR: str(Path(a.checkpoint_root).resolve())}),
        proto.INIT_TIMEOUT_S: str(spec.fault_tolerance.init_timeout_s),
        proto.REPORT_FILE: report_file, proto.PARENT_PID: str(parent_pid),
        "MESHYARD_RUN_DIR": str(Path(a.run_dir).resolve()),
    })
    if a.local_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in a.local_gpus)
    if function_config is not None:
        env[proto.FUNCTION_CONFIG] = function_config
    if probe_dir is not None:
        env[proto.PROBE_DIR] = probe_dir
        env[proto.STOP_FILE] = str(proto.stop_path(probe_dir, a.rank))
    user = dict(ep.env)
    env["PYTHONPATH"] = _pythonpath(code_dir, user=user.pop("PYTHONPATH", None),
                                    inherited=base.get("PYTHONPATH"), drop=runtime_root)
    env.update(user)
    return env
