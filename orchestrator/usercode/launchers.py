"""Multi-process launchers in `entrypoint.command`: meshyard starts one process per rank
itself, so a command that is itself a launcher (torchrun, `python -m torch.distributed.run`,
deepspeed, `accelerate launch`, mpirun / mpiexec, srun) would start a gang of its own inside
every rank. `launcher_problem` says so and shows the spec to write instead. Pure module.

>>> msg = launcher_problem(["torchrun", "--nproc_per_node=2", "train.py", "--steps", "20"])
>>> msg.split(":", 1)[0]
'torchrun is a multi-process launcher, and meshyard is the launcher here'
>>> msg.split("parallelism: ", 1)[1]
'`entrypoint: {command: [python, train.py, --steps, "20"]}` with `parallelism: {dp_replicate: 2}`.'
>>> launcher_problem(["python", "train.py"]) is None
True
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Launcher program names (a path ending in one counts) -> how their rank count is spelled.
_PROGRAMS = {"torchrun": "torchrun", "deepspeed": "deepspeed", "mpirun": "mpirun",
             "mpiexec": "mpirun", "srun": "srun", "accelerate-launch": "accelerate"}
# `python -m <module>` launchers.
_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
            "deepspeed": "deepspeed", "deepspeed.launcher.runner": "deepspeed",
            "accelerate.commands.launch": "accelerate"}
# Options that take no value, per launcher (every other `-x` / `--x` without `=` takes one).
_FLAGS = {
    "torchrun": {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path",
                 "-m", "--module"},
    "deepspeed": {"--no_python", "--no_local_rank", "--module", "--autotuning",
                  "--force_multi", "--save_pid", "--enable_each_rank_log", "--bind_cores_to_rank"},
    "accelerate": {"--cpu", "--multi_gpu", "--tpu", "--use_deepspeed", "--use_fsdp",
                   "--use_megatron_lm", "-m", "--module", "--no_python", "--debug", "-q",
                   "--quiet"},
    "mpirun": {"--oversubscribe", "--allow-run-as-root", "--bind-to-core", "--tag-output",
               "-v", "--verbose", "-q", "--quiet"},
    "srun": {"-l", "--label", "-u", "--unbuffered", "-v", "--verbose", "-Q", "--quiet",
             "--exclusive"},
}
# Options that give the number of processes: per node for torchrun and deepspeed (times the
# nodes), in all for the others.
_PROCS = {"--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num_processes", "-np",
          "-n", "--np", "--ntasks"}
_PER_NODE = {"torchrun", "deepspeed"}
_NODES = {"--nnodes", "--num_nodes", "--num_machines", "-N", "--nodes"}


def _which(argv: Sequence[str]) -> tuple[str, str, int] | None:
    """(name as written, launcher kind, index of its first own argument), or None."""
    if not argv:
        return None
    prog = argv[0].rsplit("/", 1)[-1]
    if prog in _PROGRAMS:
        return prog, _PROGRAMS[prog], 1
    if prog == "accelerate" and len(argv) > 1 and argv[1] == "launch":
        return "accelerate launch", "accelerate", 2
    if _PYTHON.match(prog):
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
            i += 1
        if i + 1 < len(argv) and argv[i] == "-m" and argv[i + 1] in _MODULES:
            return f"python -m {argv[i + 1]}", _MODULES[argv[i + 1]], i + 2
    return None


def _int(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def _split(kind: str, args: Sequence[str]) -> tuple[list[str], int | None]:
    """The launched command (what follows the launcher's options) and the rank count."""
    procs = nodes = None
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        name, eq, value = args[i].partition("=")
        if not eq and name not in _FLAGS.get(kind, set()) and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        if name in _PROCS:
            procs = _int(value) or procs
        if name in _NODES:
            nodes = _int(value) or nodes
        i += 1
    if i < len(args) and args[i] == "--":
        i += 1
    times = (nodes or 1) if kind in _PER_NODE else 1
    count = procs * times if procs is not None else None
    return list(args[i:]), count


def _yaml_item(arg: str) -> str:
    plain = re.fullmatch(r"[A-Za-z_./][\w./-]*|--?[A-Za-z][\w-]*(=[\w./-]*)?", arg)
    return arg if plain else json.dumps(arg)


def launcher_problem(argv: Sequence[str]) -> str | None:
    """What is wrong with running `argv` as a rank's command when it is a launcher, with the
    spec to write instead; None when it is not one."""
    found = _which(argv)
    if found is None:
        return None
    name, kind, first = found
    rest, count = _split(kind, argv[first:])
    if rest and (_PYTHON.match(rest[0].rsplit("/", 1)[-1])):
        cmd = ["python", *rest[1:]]
    elif rest and rest[0].endswith(".py"):
        cmd = ["python", *rest]
    elif rest:
        cmd = list(rest)
    else:
        cmd = ["python", "train.py"]
    line = "[" + ", ".join(_yaml_item(a) for a in cmd) + "]"
    ranks = str(count) if count else "N"
    return (f"{name} is a multi-process launcher, and meshyard is the launcher here: it starts "
            "one process per rank itself. Write the script's own command and put the number of "
            f"ranks in parallelism: `entrypoint: {{command: {line}}}` with "
            f"`parallelism: {{dp_replicate: {ranks}}}`.")
