"""meshyard's setup worker (workers/host/setup_worker.py) against Ray's own: the same exec
from the same arguments, held to the installed Ray's code, and Ray's own where it does not
know the case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.host import setup_worker
from workers.host.forkserver import runtime_env

WORKER = "/venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py"
ARGS = [WORKER, "--node-ip-address=127.0.0.1", "--object-store-name=/tmp/ray/s p/plasma",
        "--startup-token=7", "--ray-debugger-external", "--worker-launch-time-ms=17"]
CONTEXTS: list[dict[str, Any]] = [
    {},
    {"command_prefix": [], "env_vars": {}, "py_executable": None,
     "override_worker_entrypoint": None, "java_jars": []},
    # a worker actor's (the fork server's client as Ray's Python, a rank process with it)
    {"py_executable": runtime_env(rank=True)["py_executable"],
     "env_vars": runtime_env(rank=True)["env_vars"]},
    {"env_vars": {"A": "${HOME}/x", "B": "$HOME-${MESHYARD_TEST_UNSET_X}y", "C": "it's \"q\"",
                  "D": "${lower_case_unset}", "E": "a b\nc"}},
    {"command_prefix": ["cd", "'/tmp/a dir'", "&&"], "py_executable": "/opt/py/bin/python3 -I",
     "java_jars": ["/x.jar"]},
    {"override_worker_entrypoint": "/other/default_worker.py", "env_vars": {"X": "1"}},
]


@pytest.fixture()
def environ_restored() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _rays(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, str]]:
    """What Ray's setup worker would exec for `argv` (its parser, its RuntimeEnvContext), and
    the environment it would exec with."""
    from ray._private.runtime_env.context import RuntimeEnvContext
    from ray._private.workers.setup_worker import parser
    from ray.core.generated.common_pb2 import Language

    calls: list[list[str]] = []

    def execvp(file: str, args: list[str]) -> None:
        calls.append([file, *args])
        raise SystemExit(0)

    monkeypatch.setattr(os, "execvp", execvp)
    args, rest = parser.parse_known_args(argv)
    context = RuntimeEnvContext.deserialize(args.serialized_runtime_env_context or "{}")
    with pytest.raises(SystemExit):
        context.exec_worker(rest, Language.Value(args.language))
    monkeypatch.undo()
    return calls[0], dict(os.environ, RAY_CLIENT_MODE="0")  # Ray's import sets it (below)


@pytest.mark.parametrize("context", CONTEXTS, ids=range(len(CONTEXTS)))
@pytest.mark.parametrize("site", [[], ["-S"]], ids=["plain", "site-flag"])
def test_same_command_and_environment_as_rays(context: dict[str, Any], site: list[str],
                                              monkeypatch: pytest.MonkeyPatch,
                                              environ_restored: None) -> None:
    os.environ.pop("MESHYARD_TEST_UNSET_X", None)
    argv = [*site, *ARGS, "--serialized-runtime-env-context=" + json.dumps(context),
            "--language=PYTHON", "--arg with space", "$(touch /tmp/pwned)"]
    before = dict(os.environ)
    rays, rays_env = _rays(list(argv), monkeypatch)
    os.environ.clear()
    os.environ.update(before)
    ours = setup_worker.worker_command(list(argv))
    assert ours is not None
    assert ["bash", "bash", "-c", ours] == rays
    assert dict(os.environ) == rays_env
    assert rays_env != before or not context.get("env_vars")


def test_context_as_a_separate_argument(monkeypatch: pytest.MonkeyPatch,
                                        environ_restored: None) -> None:
    argv = [*ARGS, "--serialized-runtime-env-context", json.dumps({"env_vars": {"Q": "1"}}),
            "--language", "PYTHON"]
    rays, _ = _rays(list(argv), monkeypatch)
    assert ["bash", "bash", "-c", setup_worker.worker_command(list(argv))] == rays


@pytest.mark.parametrize("argv", [
    [*ARGS, "--serialized-runtime-env-context={}", "--language=JAVA"],
    [*ARGS, "--serialized-runtime-env-context={}"],  # no language
    [*ARGS, '--serialized-runtime-env-context={"a_field_ray_added": 1}', "--language=PYTHON"],
    [*ARGS, "--serialized-runtime-env-context={not json", "--language=PYTHON"],
    [*ARGS, "--serialized-runtime-env-context=[]", "--language=PYTHON"],
    [*ARGS, '--serialized-runtime-env-context={"env_vars": {"A": 1}}', "--language=PYTHON"],
    [*ARGS, '--serialized-runtime-env-context={"command_prefix": "cd /"}', "--language=PYTHON"],
    [*ARGS, '--serialized-runtime-env-context={"py_executable": 3}', "--language=PYTHON"],
    ["--serialized-runtime-env-context={}", "--language=PYTHON"],  # nothing to exec
], ids=["java", "no-language", "unknown-field", "bad-json", "not-an-object", "int-variable",
        "prefix-not-a-list", "python-not-a-string", "no-worker"])
def test_what_it_does_not_know_goes_to_rays(argv: list[str], environ_restored: None) -> None:
    before = dict(os.environ)
    assert setup_worker.worker_command(list(argv)) is None
    assert dict(os.environ) == before  # nothing applied


def test_rays_own_is_found_without_importing_ray() -> None:
    code = ("import sys; from workers.host.setup_worker import ray_setup_worker; "
            "print(ray_setup_worker()); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert Path(out[0]).is_file() and out[0].endswith("ray/_private/workers/setup_worker.py")
    assert out[1] == "False"


def _run(script: str, tmp_path: Path, context: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`script` as the raylet runs it, with a stand-in worker that prints what it got: its
    arguments, its whole environment, the Ray modules it holds."""
    worker = tmp_path / "worker.py"
    worker.write_text("import json, os, sys\n"
                      "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ),"
                      " 'modules': sorted(m for m in sys.modules if m.startswith('ray'))}))\n")
    env = dict(os.environ, HOME="/home/someone", RAY_CLIENT_MODE="1")
    return subprocess.run(
        [sys.executable, script, str(worker), "--x=1", "a b", "$(echo no)",
         "--serialized-runtime-env-context=" + json.dumps(context), "--language=PYTHON"],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path)


@pytest.mark.parametrize("context", [
    {"env_vars": {"A": "${HOME}/v ${MESHYARD_TEST_UNSET_X}", "RAY_CLIENT_MODE": "0"},
     "py_executable": sys.executable},
    {"command_prefix": ["cd", "/", "&&"], "py_executable": sys.executable + " -I"}],
    ids=["variables", "prefix"])
def test_script_execs_the_worker_as_rays_does(tmp_path: Path, context: dict[str, Any]) -> None:
    """Both scripts run for real on the same arguments: the worker gets the same arguments
    and the same environment (Ray's import resets RAY_CLIENT_MODE, so does this script), and
    from meshyard's without a Ray module loaded before it."""
    ours = _run(setup_worker.PATH, tmp_path, context)
    rays = _run(setup_worker.ray_setup_worker(), tmp_path, context)
    assert ours.returncode == 0 and rays.returncode == 0, (ours.stderr, rays.stderr)
    got, want = json.loads(ours.stdout), json.loads(rays.stdout)
    assert got == {**want, "modules": []}
    assert got["argv"] == ["--x=1", "a b", "$(echo no)"]
    assert got["env"]["RAY_CLIENT_MODE"] == "0"
    if "env_vars" in context:
        assert got["env"]["A"] == "/home/someone/v "


def test_script_hands_an_unknown_case_to_rays(tmp_path: Path) -> None:
    """A context field this script does not know goes to Ray's own setup worker with the same
    arguments: here Ray's does not know it either, and says so."""
    p = _run(setup_worker.PATH, tmp_path, {"a_field_ray_added": 1})
    assert p.returncode != 0
    assert "a_field_ray_added" in p.stderr and "RuntimeEnvContext" in p.stderr
