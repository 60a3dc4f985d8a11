"""The worker actor's side of a rank's confinement: what to hide and which ports to close on
this node, as a `meshyard._confine.Plan` the rank process applies before user code.

Ray's own share comes from this node (the actor runs under the raylet that started it):

* ports: the raylet's command line (worker port range, node manager, object manager, agent
  ports), every live node's advertised ports, the GCS port, and Ray's fixed ones (dashboard,
  client server, the autoscaler's and dashboard's metrics). A node whose raylet gives workers
  random ports (`--min-worker-port` unset) cannot be confined: a rank could reach any worker
  (and through it any actor), so the rank is refused with that reason;
* paths: Ray's temp dir (sessions, sockets, logs, every job's unpacked code), Ray's token
  (`~/.ray`, RAY_AUTH_TOKEN_PATH), and the host's secrets.

The control plane's share comes with the assignment (`JobConfinement`: its data dir, runs
dir and package store, its API and database ports). The TCP layer is built once per set of
ports (`port_layer`, ~60 ms) and reused by every rank this actor starts.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshyard import _confine
from orchestrator.isolation.modes import HOST_SECRETS, JobConfinement
from workers.host.assignment import RankAssignment

RAY_CLIENT_PORT = 10001
SHM_ROOT = Path("/dev/shm/meshyard")


class Unconfinable(RuntimeError):
    """This node cannot confine a rank (the message says why and what to change)."""


@dataclass(frozen=True)
class NodeShare:
    """What Ray on this node adds to every rank's plan."""

    ports: tuple[int, ...]
    hide: tuple[str, ...]


def _raylet_args() -> dict[str, str]:
    """The raylet's `--name=value` arguments (Ray gives its workers the raylet's pid in
    RAY_RAYLET_PID; a worker Ray started itself is the raylet's child, one forked by
    workers/host/forkserver.py is not)."""
    raylet = os.environ.get("RAY_RAYLET_PID", "")
    try:
        with open(f"/proc/{raylet if raylet.isdigit() else os.getppid()}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for arg in argv:
        name, eq, value = arg.lstrip("-").partition("=")
        if eq:
            out.setdefault(name.replace("-", "_"), value)
    return out


def _worker_ports(args: dict[str, str]) -> range | list[int]:
    if args.get("worker_port_list"):
        return [int(p) for p in args["worker_port_list"].split(",") if p.strip().isdigit()]
    lo, hi = int(args.get("min_worker_port") or 0), int(args.get("max_worker_port") or 0)
    if lo <= 0 or hi < lo:
        raise Unconfinable(
            "Ray on this node gives its worker processes random ports (raylet started without "
            "--min-worker-port / --max-worker-port), so a job's code could reach any Ray "
            "worker; start Ray with a worker port range (deploy/baremetal/ray-node.sh and the "
            "KubeRay manifests do), or run meshyard with MESHYARD_ISOLATION=trusted")
    return range(lo, hi + 1)


def _fixed_ports() -> set[int]:
    ports = {RAY_CLIENT_PORT}
    for module, name in (("ray._private.ray_constants", "DEFAULT_DASHBOARD_PORT"),
                         ("ray._private.ray_constants", "DEFAULT_DASHBOARD_AGENT_LISTEN_PORT"),
                         ("ray.autoscaler._private.constants", "AUTOSCALER_METRIC_PORT"),
                         ("ray.dashboard.consts", "DASHBOARD_METRIC_PORT")):
        try:
            ports.add(int(getattr(__import__(module, fromlist=[name]), name)))
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
    return ports


_NODE_PORT_KEYS = ("NodeManagerPort", "ObjectManagerPort", "MetricsExportPort",
                   "MetricsAgentPort", "DashboardAgentListenPort", "RuntimeEnvAgentPort")


def _advertised_ports(nodes: list[dict[str, Any]]) -> set[int]:
    out: set[int] = set()
    for node in nodes:
        for key in _NODE_PORT_KEYS:
            value = node.get(key)
            if isinstance(value, int) and 0 < value <= _confine.MAX_PORT:
                out.add(value)
    return out


def _gcs_port(address: str | None) -> set[int]:
    port = (address or "").rpartition(":")[2]
    return {int(port)} if port.isdigit() else set()


def _ray_paths(args: dict[str, str]) -> set[str]:
    home = Path.home()
    paths = {str(home / ".ray"), str(home / ".ssh")}
    for key in ("temp_dir", "session_dir"):
        if args.get(key):
            paths.add(args[key])
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if token:
        paths.add(token)
    return {os.path.realpath(p) for p in paths}


def node_share() -> NodeShare:
    """Ray's ports and paths on this node, read now (raises Unconfinable)."""
    import ray

    args = _raylet_args()
    ports = set(_worker_ports(args)) | _fixed_ports()
    ports |= _advertised_ports([n for n in ray.nodes() if n.get("Alive")])
    ports |= _gcs_port(ray.get_runtime_context().gcs_address)
    return NodeShare(ports=tuple(sorted(ports)),
                     hide=tuple(sorted(_ray_paths(args) | set(HOST_SECRETS))))


@functools.lru_cache(maxsize=4)
def port_layer(ports: tuple[int, ...]) -> int:
    """The descriptor of the TCP layer closing `ports`, built once and kept for this actor's
    life (each rank process restricts itself with it)."""
    rs = _confine.port_ruleset(ports)
    assert rs.fd is not None
    fd, rs.fd = rs.fd, None  # kept open: lru_cache owns it now
    return fd


def job_shm_dir(a: RankAssignment) -> Path | None:
    """The job's /dev/shm on this node (shared by its ranks here, no other job's)."""
    if not SHM_ROOT.parent.is_dir():
        return None
    path = SHM_ROOT / f"{a.job_id}-a{a.attempt}"
    SHM_ROOT.mkdir(mode=0o711, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def remove_shm_dir(a: RankAssignment) -> None:
    shutil.rmtree(SHM_ROOT / f"{a.job_id}-a{a.attempt}", ignore_errors=True)


def runtime_dirs() -> tuple[str, ...]:
    """What the rank needs to run at all, bound back read-only: the Python installation and
    meshyard's own package (not the checkout around it). An install under /tmp would
    otherwise vanish under the job's private /tmp."""
    import meshyard

    dirs = {os.path.realpath(d) for d in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    dirs.add(os.path.realpath(os.path.dirname(meshyard.__file__)))
    return tuple(sorted(dirs))


def plan_for(a: RankAssignment, job: JobConfinement, *, code_dir: str,
             share: NodeShare) -> _confine.Plan:
    """Rank `a.rank`'s plan: its run dir and checkpoint folder writable, its code and the
    data roots readable, everything else of Ray, the control plane and other jobs hidden or
    closed."""
    run_dir = Path(os.path.realpath(a.run_dir))
    tmp = run_dir / "tmp" / f"attempt-{a.attempt}"
    tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
    shm = job_shm_dir(a)
    read_only = [os.path.realpath(code_dir), *(os.path.realpath(p) for p in job.read_only),
                 *runtime_dirs()]
    return _confine.Plan(
        run_dir=str(run_dir), tmp_dir=str(tmp), shm_dir=str(shm) if shm else None,
        code_dirs=tuple(p for p in dict.fromkeys(read_only) if os.path.isdir(p)),
        hide=tuple(sorted({*share.hide, *(os.path.realpath(p) for p in job.hide)})),
        denied_ports=tuple(sorted({*share.ports, *job.denied_ports})),
        write_dirs=(os.path.realpath(a.checkpoint_dir),) if a.checkpoint_dir else ())
