"""Bare-metal units and the ray-node script: parsed, verified, and the script run dry."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.deploy.k8s_render import DEPLOY, ROOT

BM = DEPLOY / "baremetal"
SCRIPT = BM / "ray-node.sh"
VENV_BIN = Path(sys.executable).parent
UNITS = {"ray-head.service": "ray-node.sh head", "ray-worker.service": "ray-node.sh worker",
         "meshyard.service": "meshyard serve --ray-address"}


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are cased
    cp.read_string((BM / name).read_text())
    return cp


@pytest.mark.parametrize("name", sorted(UNITS))
def test_unit_runs_the_right_command_as_a_user(name: str) -> None:
    cp = unit(name)
    assert {"Unit", "Service", "Install"} <= set(cp.sections())
    svc = cp["Service"]
    assert UNITS[name] in svc["ExecStart"]
    assert svc["User"] not in ("root", "0")
    assert svc["Restart"] == "on-failure"
    assert "network-online.target" in cp["Unit"]["After"]
    assert cp["Install"]["WantedBy"] == "multi-user.target"
    env_file = svc["EnvironmentFile"]
    example = BM / (Path(env_file).name + ".example")
    assert example.exists(), f"{name}: no {example.name} documents {env_file}"


def test_control_plane_unit_migrates_then_serves_on_the_cluster() -> None:
    svc = unit("meshyard.service")["Service"]
    assert svc["ExecStartPre"].endswith("meshyard db upgrade")
    assert "${MESHYARD_RAY_ADDRESS}" in svc["ExecStart"]
    assert "--host" not in svc["ExecStart"], "binds 127.0.0.1; TLS proxy in front"
    example = (BM / "meshyard.env.example").read_text()
    assert "MESHYARD_RAY_ADDRESS=" in example and "MESHYARD_DATABASE_URL=" in example


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_every_key() -> None:
    out = subprocess.run(["systemd-analyze", "verify", *[str(BM / u) for u in UNITS]],
                         capture_output=True, text=True, timeout=60, check=False)
    # Missing /opt/meshyard binaries are expected on this machine; syntax errors are not.
    problems = [ln for ln in (out.stdout + out.stderr).splitlines()
                if "is not executable" not in ln and ln.strip()]
    assert problems == []


def test_script_parses() -> None:
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert os.access(SCRIPT, os.X_OK)


def _run(role: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, MESHYARD_BIN=str(VENV_BIN), MESHYARD_DRY_RUN="1",
                PYTHONPATH=str(ROOT), **env)
    return subprocess.run(["bash", str(SCRIPT), role], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)


def _argv(role: str, tmp_path: Path, **env: str) -> list[str]:
    """The `ray start` command the script prints for `role` (no labels file)."""
    out = _run(role, tmp_path, MESHYARD_NODE_LABELS_FILE=str(tmp_path / "missing"), **env)
    assert out.returncode == 0, out.stderr
    return shlex.split(out.stdout)


def test_worker_publishes_declared_and_cloud_levels(tmp_path: Path) -> None:
    labels = tmp_path / "node-labels"
    labels.write_text("# operator's file\nleaf=leaf-a\n"
                      "topology.k8s.aws/network-node-layer-2=spine-x\n")
    out = _run("worker", tmp_path, MESHYARD_NODE_LABELS_FILE=str(labels),
               MESHYARD_NODE_NAME="dgx-a1", RAY_HEAD_ADDRESS="10.0.0.1:6379",
               RAY_NODE_IP="10.0.0.2")
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout)
    # Ray's command line, through meshyard's setup worker (workers/host/ray_cli.py)
    assert argv[:4] == [str(VENV_BIN / "python"), "-m", "workers.host.ray_cli", "start"]
    assert argv[argv.index("--labels") + 1] == "meshyard.io/node=dgx-a1,leaf=leaf-a,spine=spine-x"
    assert argv[argv.index("--address") + 1] == "10.0.0.1:6379"
    assert argv[argv.index("--node-ip-address") + 1] == "10.0.0.2"
    assert "--block" in argv and "--head" not in argv
    assert argv[argv.index("--min-worker-port") + 1] == "10002"  # isolated mode needs a range
    assert argv[argv.index("--max-worker-port") + 1] == "19999"


def test_ray_cli_is_rays_command_line() -> None:
    """The command ray-node.sh runs is Ray's own: its `start` takes Ray's options."""
    out = subprocess.run([str(VENV_BIN / "python"), "-m", "workers.host.ray_cli", "start",
                          "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "Usage: ray start" in out.stdout
    assert "--min-worker-port" in out.stdout and "--block" in out.stdout


def test_head_without_labels_file(tmp_path: Path) -> None:
    argv = _argv("head", tmp_path, MESHYARD_NODE_NAME="head-0", RAY_PORT="6380")
    assert argv[argv.index("--labels") + 1] == "meshyard.io/node=head-0"
    assert argv[argv.index("--port") + 1] == "6380"
    assert argv[argv.index("--dashboard-host") + 1] == "127.0.0.1"
    assert "--include-dashboard" not in argv  # Ray's default: on
    assert "--num-gpus" not in argv and "--num-cpus" not in argv  # Ray detects them


def test_head_without_ray_dashboard(tmp_path: Path) -> None:
    argv = _argv("head", tmp_path, MESHYARD_NODE_NAME="head-0", RAY_DASHBOARD="0")
    assert argv[argv.index("--include-dashboard") + 1] == "false"
    argv = _argv("worker", tmp_path, MESHYARD_NODE_NAME="w-0", RAY_DASHBOARD="0",
                 RAY_HEAD_ADDRESS="10.0.0.1:6379")
    assert "--include-dashboard" not in argv  # a head's option


def test_declared_resources(tmp_path: Path) -> None:
    argv = _argv("head", tmp_path, MESHYARD_NODE_NAME="dgx-a1", RAY_NUM_GPUS="8",
                 RAY_NUM_CPUS="96")
    assert argv[argv.index("--num-gpus") + 1] == "8"
    assert argv[argv.index("--num-cpus") + 1] == "96"


@pytest.mark.parametrize("role,env,msg", [
    ("worker", {}, "RAY_HEAD_ADDRESS"), ("nope", {}, "usage"),
    ("head", {"RAY_DASHBOARD": "no"}, "RAY_DASHBOARD must be 1 or 0")])
def test_script_refuses_bad_input(tmp_path: Path, role: str, env: dict[str, str],
                                  msg: str) -> None:
    clean = {k: v for k, v in os.environ.items() if k != "RAY_HEAD_ADDRESS"}
    out = subprocess.run(["bash", str(SCRIPT), role],
                         env=dict(clean, MESHYARD_BIN=str(VENV_BIN), MESHYARD_DRY_RUN="1",
                                  MESHYARD_NODE_LABELS_FILE=str(tmp_path / "none"), **env),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and msg in out.stderr
