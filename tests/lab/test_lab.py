"""The lab itself: two hosts, each its own network namespace, address, disk and Ray node,
started through deploy/baremetal/ray-node.sh, form one Ray cluster over the lab network; a
control plane on a third host places a 2-rank job across them; a pulled link cuts a host off;
a killed host has no process left; `down()` removes everything.

The tests of this module share one lab and run in order: the last ones kill a host and take
the lab down."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.lab import lab as labmod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# One driver on the head: every node's address, hostname, labels and GPUs, and one task pinned
# to each node (by its meshyard.io/node label) reporting the host it ran in.
_REPORT = r"""
import json, socket, ray
ray.init(address=ADDRESS, logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def whoami(peer):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((peer, 9))  # no packet is sent: the kernel picks the source address
    src = s.getsockname()[0]
    s.close()
    return {"hostname": socket.gethostname(), "src_ip": src,
            "ray_ip": ray.util.get_node_ip_address()}

nodes = [n for n in ray.nodes() if n["Alive"]]
tasks = {n["Labels"]["meshyard.io/node"]:
         whoami.options(label_selector={"meshyard.io/node": n["Labels"]["meshyard.io/node"]})
         .remote(PEER) for n in nodes}
print(json.dumps({
    "nodes": [{"ip": n["NodeManagerAddress"], "hostname": n["NodeManagerHostname"],
               "port": n["NodeManagerPort"], "labels": n["Labels"],
               "gpus": n["Resources"].get("GPU", 0)} for n in nodes],
    "tasks": {name: ray.get(ref, timeout=60) for name, ref in tasks.items()},
}))
"""


@pytest.fixture(scope="module")
def report(lab: labmod.Lab) -> dict:
    code = _REPORT.replace("ADDRESS", repr(lab.ray_address)).replace(
        "PEER", repr(f"{labmod.SUBNET}.1"))
    proc = lab.python_in(lab.head, code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ray_hosts(lab: labmod.Lab) -> list[labmod.Host]:
    return [h for h in lab.hosts if h.role in ("head", "worker")]


def test_cluster_forms_with_each_hosts_address_and_labels(lab: labmod.Lab, report: dict):
    by_name = {n["labels"].get("meshyard.io/node"): n for n in report["nodes"]}
    assert sorted(by_name) == sorted(h.name for h in _ray_hosts(lab))
    assert len({n["ip"] for n in report["nodes"]}) == len(_ray_hosts(lab)) == 2
    for h in _ray_hosts(lab):
        node = by_name[h.name]
        assert node["ip"] == h.ip
        assert node["ip"].startswith(f"{labmod.SUBNET}.")
        assert node["hostname"] == h.name  # its own UTS namespace
        assert node["labels"]["leaf"] == h.labels["leaf"]
        assert node["labels"]["spine"] == h.labels["spine"]
        assert node["gpus"] == h.gpus > 0  # declared from the host's topo -m capture
    assert len({h.labels["leaf"] for h in _ray_hosts(lab)}) == 2


def test_a_task_on_each_host_reports_that_hosts_address(lab: labmod.Lab, report: dict):
    assert sorted(report["tasks"]) == sorted(h.name for h in _ray_hosts(lab))
    for h in _ray_hosts(lab):
        got = report["tasks"][h.name]
        assert got == {"hostname": h.name, "src_ip": h.ip, "ray_ip": h.ip}


def test_each_host_has_its_own_nvidia_smi_capture(lab: labmod.Lab):
    for h in _ray_hosts(lab):
        out = lab.run_in(h, ["nvidia-smi", "topo", "-m"], check=True).stdout
        assert out == (labmod.SAMPLES / h.topo).read_text()
    assert lab.hosts[0].topo != lab.hosts[1].topo


def test_a_hosts_run_dir_is_invisible_to_the_others(lab: labmod.Lab):
    a, b, c = lab.hosts
    mark = f"written-on-{a.name}-{time.time_ns()}"
    lab.run_in(a, ["sh", "-c", f"echo {mark} > {labmod.RUN_DIR}/private.txt"], check=True)
    seen_a = lab.run_in(a, ["cat", f"{labmod.RUN_DIR}/private.txt"])
    assert seen_a.stdout.strip() == mark
    seen_b = lab.run_in(b, ["cat", f"{labmod.RUN_DIR}/private.txt"])
    assert seen_b.returncode != 0 and "No such file" in seen_b.stderr
    assert lab.run_in(c, ["test", "-e", f"{labmod.RUN_DIR}/private.txt"]).returncode == 1
    assert not (Path(labmod.RUN_DIR) / "private.txt").exists()  # the root namespace
    # Ray's own session files live on each host's disk too
    ls_b = lab.run_in(b, ["ls", f"{labmod.RUN_DIR}/ray"], check=True).stdout.split()
    assert "session_latest" in ls_b


_SUBMIT = r"""
import json
import sys
from pathlib import Path
from api.client import MeshyardClient
spec = json.loads(SPEC)

def evidence(c, job):
    # rank 0's whole log and rank 1's last lines; the events last, where a failure's
    # message (the end of stderr) keeps them
    return {"state": job.state.value, "message": job.message,
            "logs": [x.line for x in c.logs(job.id, rank=0, limit=1000).items],
            "rank_1_tail": [x.line for x in c.logs(job.id, rank=1, limit=1000).items][-40:],
            "ranks": [r.model_dump(mode="json") for r in c.ranks(job.id).items],
            "events": [e.model_dump(mode="json") for e in c.events(job.id)]}

with MeshyardClient(URL, TOKEN) as c:
    job = (c.submit_with_code(spec, working_dir=Path(CODE)) if CODE else c.submit(spec))
    try:
        done = c.wait(job.id, timeout_s=240)
    except TimeoutError:  # what the job was doing, for the failure's message
        print(json.dumps(evidence(c, c.get_job(job.id)), default=str), file=sys.stderr)
        raise
    print(json.dumps(evidence(c, done)))
"""
_TOKEN = "lab-admin-token-" + "0" * 24
_BUILT_IN = {"version": 1, "name": "lab-two-hosts",
             "resources": {"device": "cpu", "cpus_per_worker": 2},  # a whole host a rank
             "parallelism": {"dp_replicate": 2},
             "model": {"kind": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 32,
                       "vocab_size": 64, "seq_len": 16},
             "training": {"steps": 5, "micro_batch_size": 2, "lr": 0.003}}


@pytest.fixture(scope="module")
def serving(lab: labmod.Lab) -> str:
    """Like a deployment's control plane, on the third host: a Ray node with nothing to
    schedule on, then `meshyard serve` as its driver on the lab network (no checkpoint
    storage: the hosts have only their own disks). Its URL."""
    cp = lab.hosts[2]
    assert cp.role == "plain"
    lab.start_ray(cp, cpus=0, gpus=0)
    lab.wait_nodes(3)
    lab.spawn_in(cp, [f"{sys.prefix}/bin/meshyard", "serve", "--host", cp.ip, "--port", "8470",
                      "--data-dir", f"{labmod.RUN_DIR}/meshyard",
                      "--ray-address", lab.ray_address, "--no-access-log"],
                 log="serve.log", env={"MESHYARD_ADMIN_TOKEN": _TOKEN,
                                       "MESHYARD_WARM_POOL_USER_CODE": "0"})
    lab.wait_port(cp, 8470, timeout=120)
    return f"http://{cp.ip}:8470"


def _run_job(lab: labmod.Lab, url: str, spec: dict, code: str | None = None) -> dict:
    """Submits from a client on the head (another host than the control plane's)."""
    script = (_SUBMIT.replace("URL", repr(url)).replace("TOKEN", repr(_TOKEN))
              .replace("SPEC", repr(json.dumps(spec))).replace("CODE", repr(code)))
    proc = lab.python_in(lab.head, script, timeout=300)
    assert proc.returncode == 0, proc.stderr[-12000:] + lab.log_tail(lab.hosts[2], "serve.log")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _two_hosts(lab: labmod.Lab, out: dict) -> list[labmod.Host]:
    ranks = {r["rank"]: r for r in out["ranks"]}
    assert sorted(ranks) == [0, 1]
    hosts = [lab.host(ranks[i]["node"]) for i in (0, 1)]
    assert hosts[0].name != hosts[1].name and hosts[0].ip != hosts[1].ip
    assert {h.role for h in hosts} == {"head", "worker"}  # not the control plane's host
    master = next(e["data"]["master"] for e in out["events"]
                  if e["reason"] == "WORKERS_READY")
    assert master["addr"] == hosts[0].ip  # MASTER_ADDR: rank 0's host, on the lab network
    return hosts


@pytest.mark.slow
def test_control_plane_on_its_own_host_places_a_job_across_two_hosts(lab: labmod.Lab,
                                                                      serving: str):
    out = _run_job(lab, serving, {**_BUILT_IN, "checkpoint": {"enabled": False}})
    assert out["state"] == "SUCCEEDED", out["events"]
    _two_hosts(lab, out)
    assert [r["step"] for r in sorted(out["ranks"], key=lambda r: r["rank"])] == [5, 5]

    # The same job keeping checkpoints would split them over the two hosts' own disks: it
    # does not start, and says which setting to give.
    out = _run_job(lab, serving, {**_BUILT_IN, "checkpoint": {"every_steps": 2}})
    assert out["state"] == "FAILED", out["events"]
    refused = next(e for e in out["events"] if e["reason"] == "SETUP_ERROR")
    assert "landed on 2 hosts" in refused["message"]
    assert "MESHYARD_CHECKPOINT_STORAGE" in refused["message"]
    assert not any(e["reason"] == "WORKERS_READY" for e in out["events"])


@pytest.mark.slow
def test_user_scripts_meet_across_hosts_and_a_checkpoint_they_cannot_keep_is_refused(
        lab: labmod.Lab, serving: str):
    """Uploaded code reaches both hosts; the script's gloo rendezvous (after meshyard's
    pre-flight check on its own port) meets at rank 0's host address. A function that reports
    a checkpoint there, with no storage every host reads, fails naming the setting."""
    ddp = {"version": 1, "name": "lab-script", "parallelism": {"dp_replicate": 2},
           "resources": {"device": "cpu", "cpus_per_worker": 2},
           "entrypoint": {"command": ["python", "train.py", "--steps", "8"]}}
    out = _run_job(lab, serving, ddp, code="examples/byo/ddp")
    assert out["state"] == "SUCCEEDED", (out["message"], out["events"])
    _two_hosts(lab, out)
    assert any(line.startswith("step 8 loss") for line in out["logs"]), out["logs"][-10:]
    func = {"version": 1, "name": "lab-func", "parallelism": {"dp_replicate": 2},
            "resources": {"device": "cpu", "cpus_per_worker": 2},
            "entrypoint": {"function": "train:train_func",
                           "config": {"lr": 0.001, "epochs": 1, "batch_size": 64}}}
    out = _run_job(lab, serving, func, code="examples/byo/raytrain")
    assert out["state"] == "FAILED", out["events"]
    assert "meshyard cannot keep this checkpoint: the ranks landed on 2 hosts" in \
        out["message"], out["message"]
    assert "MESHYARD_CHECKPOINT_STORAGE" in out["message"]


def test_link_down_cuts_the_host_off_and_link_up_restores_it(lab: labmod.Lab, report: dict):
    worker = lab.hosts[1]
    port = next(n["port"] for n in report["nodes"] if n["ip"] == worker.ip)
    assert lab.tcp_connects(lab.head, worker.ip, port)
    lab.link_down(worker)
    try:
        t0 = time.monotonic()
        assert not lab.tcp_connects(lab.head, worker.ip, port, timeout=3)
        assert not lab.tcp_connects(worker, lab.head.ip, labmod.RAY_PORT, timeout=3)
        assert time.monotonic() - t0 < 30
    finally:
        lab.link_up(worker)
    deadline = time.monotonic() + 20
    while not lab.tcp_connects(lab.head, worker.ip, port, timeout=2):
        assert time.monotonic() < deadline, "link_up did not restore the connection"
        time.sleep(0.5)
    # the machine's own namespace saw no address come or go: the lab's links carry none
    # (a browser on the machine aborts its requests on an address change)
    assert _root_lab_addresses() == []


def _root_lab_addresses() -> list[str]:
    shown = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return [line for line in shown if f" {labmod.PREFIX}" in line]


def test_slow_link_shapes_both_directions(lab: labmod.Lab):
    worker = lab.hosts[1]
    lab.slow_link(worker, "2mbit")
    try:
        outside = subprocess.run(["tc", "qdisc", "show", "dev", worker.name],
                                 capture_output=True, text=True, check=True).stdout
        inside = lab.run_in(worker, ["tc", "qdisc", "show", "dev", "eth0"], check=True).stdout
        for shown in (outside, inside):
            assert "tbf" in shown and "2Mbit" in shown
    finally:
        lab.slow_link(worker, None)
    inside = lab.run_in(worker, ["tc", "qdisc", "show", "dev", "eth0"], check=True).stdout
    assert "tbf" not in inside


def test_kill_host_leaves_no_process_of_that_host(lab: labmod.Lab):
    worker = lab.hosts[1]
    before = lab.host_pids(worker)
    assert len(before) >= 3  # ray-node.sh's ray start, raylet, and more
    killed = lab.kill_host(worker)
    # each process seen before is gone: killed, or ended on its own meanwhile (a Ray worker
    # the jobs above left idle)
    assert not {p for p in before - killed if Path(f"/proc/{p}").exists()
                and p in labmod.netns_pids(worker.name)}
    assert killed and lab.host_pids(worker) == set()
    assert labmod.netns_pids(worker.name) == {worker.keeper[0]}  # the disk's holder stays
    assert lab.host_pids(lab.head)  # the head runs on


def test_a_host_whose_ray_exited_is_started_again_and_rejoins(lab: labmod.Lab):
    # The worker's Ray was killed above: its ray-node.sh has exited, as after a `ray start`
    # that gave up on a slow raylet. The lab starts it again, as the bare-metal units do.
    worker = lab.hosts[1]
    code = f"""
import json, ray
ray.init(address={lab.ray_address!r}, logging_level="ERROR", log_to_driver=False)
print(json.dumps([n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == {worker.ip!r}]))
"""
    before = set(json.loads(lab.python_in(lab.head, code, check=True).stdout.splitlines()[-1]))
    assert lab.restart_failed_starts() == [worker.name]
    assert lab.restart_failed_starts() == []  # the new one runs
    wait = f"""
import time, ray
ray.init(address={lab.ray_address!r}, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    if any(n["Alive"] and n["NodeManagerAddress"] == {worker.ip!r}
           and n["NodeID"] not in {sorted(before)!r} for n in ray.nodes()):
        break
    time.sleep(0.5)
else:
    raise SystemExit("no new Ray node on {worker.ip}")
"""
    lab.python_in(lab.head, wait, timeout=300, check=True)


def test_down_leaves_nothing_behind(lab: labmod.Lab):
    recorded = [rec for h in lab.hosts for rec in [*h.pids, h.keeper]]
    assert recorded
    assert labmod.down() == []
    assert labmod.down() == []  # idempotent
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert labmod.PREFIX not in netns
    assert f" {labmod.PREFIX}" not in links
    assert not any(labmod._alive(rec) for rec in recorded)
    assert not labmod.STATE_DIR.exists()
    assert labmod.PREFIX not in Path("/proc/self/mountinfo").read_text()
