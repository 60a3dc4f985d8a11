"""The first process of every Ray worker process on a meshyard node, in place of Ray's own
`ray/_private/workers/setup_worker.py`: standard library only.

The raylet starts each worker process as `python SETUP_WORKER [-S] default_worker.py ARGS
--serialized-runtime-env-context=JSON --language=PYTHON`. Ray's setup worker applies the
runtime env's context (its environment variables, its Python, a command prefix, another
entrypoint) and execs `bash -c "PREFIX exec PYTHON default_worker.py ARGS"`; it imports Ray to
do so, about half a CPU-second before the worker's own import of Ray, in every worker
process a node starts (each attempt controller, each Ray task worker, each worker actor's
fork-server client). This script does the same exec from the same arguments, with what Ray's
`RuntimeEnvContext.exec_worker` and `update_envs` do on Linux written out
(tests/unit/workers/test_setup_worker.py holds it to the installed Ray's own code).

Anything it was not written for (another language, another platform, a context with a field
it does not know, arguments it cannot parse) goes to Ray's own setup worker with the same
arguments, so a worker starts either way. `ray_params()` gives the keyword that makes a Ray
node use it (RayParams' `setup_worker_path`, which ray.cluster_utils.Cluster passes on);
`installed()` makes every node started in its block use it (`ray.init` of a local cluster,
`ray start` through workers/host/ray_cli.py).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a script: sys.path[0] is this folder, not the stdlib's
    del sys.path[0]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from importlib.util import find_spec  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

PATH = os.path.abspath(__file__)
# RuntimeEnvContext's fields (ray/_private/runtime_env/context.py) that exec_worker reads for a
# Python worker, and java_jars, which it reads only for Java.
FIELDS = frozenset({"command_prefix", "env_vars", "py_executable",
                    "override_worker_entrypoint", "java_jars"})
_UNSET_VAR = re.compile(r"\$\{[A-Z0-9_]+\}")


def ray_setup_worker() -> str:
    """Ray's own setup worker, found without importing Ray."""
    spec = find_spec("ray")
    if spec is None or spec.origin is None:
        raise RuntimeError("Ray is not installed for " + sys.executable)
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "setup_worker.py")


def _parser() -> argparse.ArgumentParser:
    """The arguments Ray's setup worker takes; the rest pass through to the worker."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", type=str)
    parser.add_argument("--language", type=str)
    return parser


def worker_command(argv: list[str]) -> str | None:
    """The `bash -c` command Ray's setup worker would exec for `argv`, once the context's
    variables are in os.environ (set here, as Ray's do); None, with nothing set, where this
    script does not know the case."""
    if sys.platform != "linux":
        return None
    try:
        args, passthrough = _parser().parse_known_args(argv)
        context = json.loads(args.serialized_runtime_env_context or "{}")
    except (SystemExit, ValueError):
        return None
    if args.language != "PYTHON" or not isinstance(context, dict) or set(context) - FIELDS:
        return None
    prefix = context.get("command_prefix") or []
    env_vars = context.get("env_vars") or {}
    python = context.get("py_executable") or sys.executable
    entrypoint = context.get("override_worker_entrypoint")
    if not (passthrough and _strings(prefix) and isinstance(env_vars, dict)
            and _strings([*env_vars, *env_vars.values(), python])
            and (entrypoint is None or isinstance(entrypoint, str))):
        return None
    os.environ["RAY_CLIENT_MODE"] = "0"  # what importing Ray does (client_mode_hook.py)
    for key, value in env_vars.items():  # Ray's update_envs: ${X} from the environment
        os.environ[key] = _UNSET_VAR.sub("", os.path.expandvars(value))
    if entrypoint:
        passthrough[0] = entrypoint
    return " ".join([*prefix, "exec", python, *(shlex.quote(a) for a in passthrough)])


def _strings(items: object) -> bool:
    return isinstance(items, list) and all(isinstance(i, str) for i in items)


def main(argv: list[str]) -> NoReturn:
    command = worker_command(list(argv))
    if command is None:
        os.execv(sys.executable, [sys.executable, ray_setup_worker(), *argv])
    os.execvp("bash", ["bash", "-c", command])


def ray_params() -> dict[str, Any]:
    """RayParams' keyword for a node that starts its worker processes through this script
    (ray.cluster_utils.Cluster's head_node_args and add_node take it)."""
    return {"setup_worker_path": PATH}


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Ray nodes this process starts inside this block use this script: Ray's Node joins its
    own `workers` folder with ray_constants.SETUP_WORKER_FILENAME, which an absolute path
    replaces."""
    from ray._private import ray_constants

    saved = ray_constants.SETUP_WORKER_FILENAME
    ray_constants.SETUP_WORKER_FILENAME = PATH
    try:
        yield
    finally:
        ray_constants.SETUP_WORKER_FILENAME = saved


if __name__ == "__main__":
    main(sys.argv[1:])
