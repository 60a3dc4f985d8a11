"""The local Ray `meshyard serve` starts on its embedded defaults (`init_local_ray`).

The local Ray runs in a child process: a driver that started and shut down a local cluster
leaves Ray's process-wide state such that a later connection of the same process to the
package's cluster can be torn down as soon as it makes actors (seen in this package).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, re, sys, time
from pathlib import Path
import ray
from orchestrator.runtime.service import init_local_ray
from workers.host.forkserver import runtime_env

def started(session):
    text = (session / "logs" / "raylet.out").read_text(errors="replace")
    return re.findall(r"Started worker process with pid (\d+)", text)

init_local_ray(worker_ports=None, num_cpus=2)
try:
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    deadline = time.monotonic() + 5  # a prestart follows the driver's registration
    while time.monotonic() < deadline and not started(session):
        time.sleep(0.2)
    before = started(session)

    @ray.remote(num_cpus=0)
    def pid():
        return os.getpid()

    worker = ray.get(pid.remote(), timeout=120)
    after = started(session)

    # a worker actor as meshyard starts one: a runtime_env (the fork server's client as its
    # Python) and a variable, so the raylet starts it through the setup worker
    @ray.remote(num_cpus=0)
    class Actor:
        def env(self):
            return os.environ.get("MESHYARD_T"), os.environ.get("RAY_CLIENT_MODE")

    env = runtime_env()
    env["env_vars"] = {"MESHYARD_T": "${HOME}/t"}
    actor = Actor.options(runtime_env=env).remote()
    got = ray.get(actor.env.remote(), timeout=180)
    raylet = ray._private.worker.global_worker.node.all_processes["raylet"][0].process.pid
    argv = Path(f"/proc/{raylet}/cmdline").read_text().split("\0")
    command = next(a for a in argv if a.startswith("--python_worker_command="))
    print(json.dumps({"before": before, "after": after, "worker": worker,
                      "actor": got, "command": command}))
finally:
    ray.shutdown()
"""


def test_local_ray_starts_worker_processes_only_for_work() -> None:
    """Ray's default starts one idle worker per CPU when the first driver connects; the local
    Ray starts none until there is work, then starts the task's; a worker actor starts
    through meshyard's setup worker."""
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # the product's
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=str(root))
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=root, capture_output=True,
                       text=True, timeout=240, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["before"] == [], got
    assert str(got["worker"]) in got["after"], got
    # its worker processes start through meshyard's setup worker, which applies a runtime
    # env as Ray's does (tests/unit/workers/test_setup_worker.py holds it to Ray's code)
    from workers.host import setup_worker

    assert got["command"].split()[1] == setup_worker.PATH, got["command"]
    assert got["actor"] == [os.environ["HOME"] + "/t", "0"], got
