"""A control plane on a lab host and a client that watches one job: what the fault tests
(tests/lab/test_faults.py) and the chaos bench (bench/chaos.py) share.

`meshyard serve` runs on the lab's last host (a plain host joined to Ray with nothing to
schedule on, as a deployment's control plane is), its database on that host's private disk
and its checkpoints on the lab's object store: an S3-compatible server on the same host
(deploy/lab/s3server.py), which the Ray hosts reach over the lab network and the job's
ranks never see (they keep checkpoints on their hosts' private disks; meshyard's worker
actors upload and download them). A client on the head submits a job and
logs, as JSON lines in the head's lab dir, the job's state, ranks and new events every half
second (`Watch`); readers wait on that log with generous bounds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploy.lab import lab as labmod
from deploy.lab import s3server

TOKEN = "lab-admin-token-" + "0" * 24
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
PORT = 8470

# A 2-rank built-in job, one rank a host (each rank takes a whole 2-CPU host), that trains
# until cancelled; `max_failures: 1` allows one restart.
SPEC: dict[str, Any] = {
    "version": 1, "name": "lab-fault",
    "resources": {"device": "cpu", "cpus_per_worker": 2},
    "parallelism": {"dp_replicate": 2},
    "model": {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 64,
              "seq_len": 16},
    "training": {"steps": 5000, "micro_batch_size": 2, "lr": 0.003},
    "checkpoint": {"enabled": False},
    "fault_tolerance": {"max_failures": 1}}
# The same job saving a checkpoint every 10 steps (to the object store, through its hosts).
CHECKPOINTED: dict[str, Any] = {**SPEC, "checkpoint": {"enabled": True, "every_steps": 10,
                                                       "keep": 2, "async_save": False}}

_WATCH = r"""
import json, sys, time
from api.client import MeshyardClient
c = MeshyardClient(sys.argv[1], sys.argv[2])
job = c.submit(json.loads(sys.argv[3]))
print(json.dumps({"job": job.id}), flush=True)
seen = 0
while True:
    try:
        j = c.get_job(job.id)
        for e in c.events(job.id, after=seen):
            seen = max(seen, e.id)
            print(json.dumps({"t": time.time(), "event": e.model_dump(mode="json")}), flush=True)
        ranks = [[r.rank, r.node, r.step or 0, r.attempt] for r in c.ranks(job.id).items]
        print(json.dumps({"t": time.time(), "state": j.state.value,
                          "attempt": j.current_attempt, "ranks": ranks}), flush=True)
        if j.state.value in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
    except Exception as exc:
        print(json.dumps({"t": time.time(), "error": repr(exc)[:300]}), flush=True)
    time.sleep(0.5)
"""


def control_plane(lab: labmod.Lab) -> labmod.Host:
    return lab.hosts[-1]


def start_store(lab: labmod.Lab) -> dict[str, str]:
    """The lab's S3-compatible server on the control plane's host, its bucket made; returns
    the control plane's settings for it (also kept in the host's lab dir, `s3.json`)."""
    cp = control_plane(lab)

    def run_python(code: str) -> None:
        lab.python_in(cp, code, check=True, timeout=90)

    server = s3server.start(cp.ip, log=cp.dir / "s3.log", run_python=run_python,
                            spawn=lambda argv: lab.spawn_in(cp, argv, log="s3.log"))
    env = server.env()
    (cp.dir / "s3.json").write_text(json.dumps(env))
    return env


def store_env(lab: labmod.Lab) -> dict[str, str]:
    """The settings `start_store` returned."""
    return dict(json.loads((control_plane(lab).dir / "s3.json").read_text()))


def store_keys(lab: labmod.Lab, job_id: str) -> list[str]:
    """Every object of the job's checkpoints in the lab's store, relative to its folder (read
    on the control plane's host, the way meshyard reads them)."""
    code = ("import json, os\n"
            "from orchestrator.storage.object_storage import ObjectStorage\n"
            "from pyarrow import fs as pafs\n"
            "e = json.loads(os.environ['LAB_S3'])\n"
            "s = ObjectStorage.parse(e['MESHYARD_CHECKPOINT_URI'], "
            "endpoint=e['MESHYARD_S3_ENDPOINT'], access_key=e['MESHYARD_S3_ACCESS_KEY'], "
            "secret_key=e['MESHYARD_S3_SECRET_KEY'])\n"
            f"base = s.job_path({job_id!r})\n"
            "infos = s.filesystem().get_file_info(pafs.FileSelector(base, recursive=True, "
            "allow_not_found=True))\n"
            "print(json.dumps(sorted(i.path[len(base) + 1:] for i in infos "
            "if i.type is pafs.FileType.File)))\n")
    out = lab.python_in(control_plane(lab), code, check=True,
                        env={"LAB_S3": json.dumps(store_env(lab))})
    return list(json.loads(out.stdout))


def start_serve(lab: labmod.Lab) -> None:
    """`meshyard serve` on the control plane's host, its checkpoints on the lab's store."""
    cp = control_plane(lab)
    lab.spawn_in(cp, [f"{sys.prefix}/bin/meshyard", "serve", "--host", cp.ip,
                      "--port", str(PORT), "--data-dir", f"{labmod.RUN_DIR}/meshyard",
                      "--ray-address", lab.ray_address, "--no-access-log"],
                 log="serve.log", env={"MESHYARD_ADMIN_TOKEN": TOKEN,
                                       "MESHYARD_WARM_POOL_USER_CODE": "0", **store_env(lab)})
    lab.wait_port(cp, PORT, timeout=180)


def serve_pids(lab: labmod.Lab) -> set[int]:
    """The control plane's host's `meshyard serve` processes."""
    out = set()
    for pid in lab.host_pids(control_plane(lab)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/meshyard") for a in argv[:2]) and b"serve" in argv:
            out.add(pid)
    return out


def up(ray_hosts: int = 3) -> labmod.Lab:
    """A lab of `ray_hosts` Ray hosts plus the control plane's host, serving."""
    lab = labmod.up(ray_hosts, plain=1)  # removes what it made when it fails
    try:
        lab.start_ray(control_plane(lab), cpus=0, gpus=0)
        lab.wait_nodes(ray_hosts + 1)
        start_store(lab)
        start_serve(lab)
    except BaseException:
        labmod.down()
        raise
    return lab


class Watch:
    """The head's client: submits the job and logs what it sees."""

    def __init__(self, lab: labmod.Lab, log: str, spec: dict[str, Any] = SPEC) -> None:
        self.lab, self.path = lab, lab.head.dir / log
        self.url = f"http://{control_plane(lab).ip}:{PORT}"
        lab.spawn_in(lab.head, [sys.executable, "-c", _WATCH, self.url, TOKEN,
                                json.dumps(spec)], log=log)

    def lines(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except OSError:
            return []
        return [json.loads(x) for x in text.splitlines() if x.startswith("{")]

    @property
    def job(self) -> str:
        return next(x["job"] for x in self.lines() if "job" in x)

    def states(self) -> list[dict[str, Any]]:
        return [x for x in self.lines() if "state" in x]

    def events(self) -> list[dict[str, Any]]:
        return [x["event"] for x in self.lines() if "event" in x]

    def wait(self, what: str, cond: Callable[[Watch], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond(self)
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"{what} not seen in {timeout:g} s; events: "
                             f"{[(e['reason'], e['message'][:200]) for e in self.events()]}; "
                             f"{self.lab.log_tail(control_plane(self.lab), 'serve.log')}")

    def client(self, call: str) -> Any:
        """`call` (an expression of `c`, the client, and JOB) run on the head; its JSON."""
        code = (f"import json\nfrom api.client import MeshyardClient\n"
                f"with MeshyardClient({self.url!r}, {TOKEN!r}) as c:\n"
                f"    print(json.dumps({call.replace('JOB', repr(self.job))}))")
        proc = self.lab.python_in(self.lab.head, code, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(proc.stderr[-2000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def ended(self) -> str | None:
        st = self.states()
        return st[-1]["state"] if st and st[-1]["state"] in TERMINAL else None

    def cancel(self) -> None:
        """Cancels the job (one that already ended stays as it is) and waits for its end."""
        if self.ended() is None:
            self.client("c.cancel(JOB).state.value")
        self.wait("the job's end", lambda w: w.ended(), timeout=120)


def training(w: Watch, attempt: int, step: int) -> list[list[Any]] | None:
    """Both ranks of `attempt` at `step` or later: their [rank, node, step, attempt]."""
    st = w.states()
    if st and st[-1]["attempt"] == attempt and len(st[-1]["ranks"]) == 2 and \
            all(r[2] >= step and r[3] == attempt for r in st[-1]["ranks"]):
        return st[-1]["ranks"]
    return None


def failed(w: Watch) -> dict[str, Any] | None:
    """The attempt's failure event (an allowed restart follows it)."""
    return next((e for e in w.events() if e["reason"] in ("WORKER_CRASH", "HANG_DETECTED")
                 and "allowed" in e["message"]), None)


def node_state(w: Watch, node: str) -> str:
    nodes = w.client("[n.model_dump(mode='json') for n in c.list_nodes().items]")
    return next((n["state"] for n in nodes if n["name"] == node), "healthy")
