"""Hostile jobs against a real `meshyard serve` (embedded Ray, isolated mode, warm pool with
prestarted rank processes) shared by two users.

alice runs a victim job: a checkpoint of known bytes, a secret in its `entrypoint.env`, its
processes alive. mallory, a plain user, runs the attack kit (kit/attack.py) from inside her
rank, four ways: a command and a function, each once on a prestarted (pooled) rank process
and once started cold. Every attempt to leave her job must fail, the kit's controls must
work, and afterwards nothing of alice's or of the control plane has changed: the checkpoint
bytes, the victim still running, the admin token unread, alice's next job placed as usual.
The cluster's checkpoint store (an S3 server that checks every request's signature) answers
her and refuses her: its keys reach no job.
A hung hostile job that answers the watchdog itself (kit/hang.py) can neither make the
server serve a file outside its run dir nor run code where its Flight Recorder dump is read.

The targets (Ray's listening ports, sockets and processes, the files) are read from the host
by the test, so the kit aims at what is really there; each TCP port is checked to accept a
connection from the test before the kit is refused it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from api.client import MeshyardAPIError, MeshyardClient
from deploy.lab import s3server
from meshyard import _landlock
from tests.support.serve import serve_url, stop_serve

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_landlock.abi() < 6, reason="the kernel's Landlock is older than ABI 6 "
                       "(Linux 6.12): isolated mode refuses users' code on such a host"),
]


@dataclass
class Lab:
    url: str
    data: Path
    ray_tmp: Path
    admin: str
    alice: str
    mallory: str
    serve: subprocess.Popen[bytes]
    store: s3server.S3Server
    victim: str = ""
    victim_bytes: bytes = b""
    victim_secret: str = ""
    kit: str = ""  # mallory's package
    targets: dict[str, Any] = field(default_factory=dict)
    code: dict[str, str | None] = field(default_factory=dict)  # alice's code: path -> sha


def _start(data: Path, *, token: str, ray_tmp: Path,
           store: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MESHYARD_", "RAY_", "AWS_"))}
    env.update(store)  # the checkpoint store and its keys
    env.update(MESHYARD_ADMIN_TOKEN=token, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_TMPDIR=str(ray_tmp), MESHYARD_ALLOW_FAULT_INJECTION="0",
               MESHYARD_WARM_POOL="3")  # the victim and the two pooled variants
    data.mkdir(parents=True)
    (data / "datasets").mkdir()
    (data / "datasets" / "shared.txt").write_text("a dataset every job may read\n")
    (data / "admin.token").write_text(token + "\n")  # as a first start leaves it
    log = open(data / "serve.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([str(Path(sys.executable).parent / "meshyard"), "serve", "--port",
                             "0", "--data-dir", str(data), "--no-access-log"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=REPO)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _listening(procs: list[psutil.Process]) -> dict[int, str]:
    """port -> the process listening on it (TCP, any address)."""
    by_pid = {p.pid: p for p in procs}
    out: dict[int, str] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in by_pid:
            with _quiet():
                out[conn.laddr.port] = by_pid[conn.pid].name()
    return out


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *rest: Any) -> bool:
        return kind is not None and issubclass(kind, psutil.Error)


def _wait_log(client: MeshyardClient, job_id: str, needle: str, *, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = client.logs(job_id, rank=0).items
        for line in lines:
            if needle in line.line:
                return line.line
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} never appeared in job {job_id}'s log")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    data = tmp_path_factory.mktemp("hostile") / "data"
    token = "msy_admin-" + secrets.token_urlsafe(24)
    ray_tmp = Path("/tmp") / f"meshyard-hostile-{secrets.token_hex(4)}"
    # The cluster's checkpoint store: one that refuses requests not signed with its keys,
    # which only the control plane holds.
    store = s3server.start("127.0.0.1", log=data.parent / "s3.log", authenticated=True)
    try:
        proc = _start(data, token=token, ray_tmp=ray_tmp, store=store.env())
    except BaseException:
        store.stop()
        raise
    try:
        url = serve_url(data, proc, token=token, timeout_s=180)
        with MeshyardClient(url, token) as admin:
            alice = admin.create_token(user="alice").token
            mallory = admin.create_token(user="mallory").token
            assert admin.cluster().isolation.confined, admin.cluster().isolation
        lab = Lab(url=url, data=data, ray_tmp=ray_tmp, admin=token, alice=alice,
                  mallory=mallory, serve=proc, store=store)
        _start_victim(lab)
        with MeshyardClient(url, mallory) as client:
            lab.kit = client.upload_dir(HERE / "kit").package
        lab.targets = _targets(lab)
        yield lab
    finally:
        stop_serve(proc, timeout_s=60)
        store.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _start_victim(lab: Lab) -> None:
    lab.victim_bytes = secrets.token_bytes(64)
    lab.victim_secret = "alice-secret-" + secrets.token_hex(12)
    spec = {"name": "victim", "resources": {"device": "cpu", "cpus_per_worker": 0.5},
            "entrypoint": {"function": "victim:main",
                           "config": {"bytes": lab.victim_bytes.hex(), "seconds": 900},
                           "env": {"ALICE_SECRET": lab.victim_secret}}}
    with MeshyardClient(lab.url, lab.alice) as client:
        job = client.submit_with_code(spec, working_dir=HERE / "victim")
        lab.victim = job.id
        _wait_log(client, job.id, "VICTIM-READY", timeout_s=240)


def _targets(lab: Lab) -> dict[str, Any]:
    """What the hostile jobs aim at, read from the host now."""
    procs = _tree(lab.serve.pid)
    ports = _listening(procs)
    gcs = next(p for p, name in ports.items() if name == "gcs_server")
    with MeshyardClient(lab.url, lab.alice) as client:
        ranks = client.ranks(lab.victim).items
    victim_pid = next(r.pid for r in ranks if r.pid)
    pids = {lab.serve.pid, victim_pid, psutil.Process(victim_pid).ppid()}
    pids |= {p.pid for p in procs if p.name() in ("gcs_server", "raylet")}
    with _quiet():
        pids |= {p.pid for p in procs if "meshyard._prestart" in " ".join(p.cmdline())}
    fork_sockets = [str(p) for p in lab.ray_tmp.glob("**/meshyard-fork-*.sock")]
    with _quiet():  # the fork server the workers came from: no longer under the service
        forkers = {p.pid for p in psutil.process_iter(["cmdline"])
                   if "workers.host.forkserver" in (p.info["cmdline"] or [])
                   and any(s in (p.info["cmdline"] or []) for s in fork_sockets)}
    assert forkers and fork_sockets, "the victim's workers were not forked by a fork server"
    pids |= forkers
    run = lab.data / "runs" / lab.victim
    code = [str(p) for p in (*lab.ray_tmp.glob("session_*/runtime_resources/working_dir_files/"
                                               "*/meshyard-code/victim.py"),
                             *run.glob("code/*/meshyard-code/victim.py"))]
    token_file = lab.data / "admin.token"
    lab.code = {p: _sha(p) for p in code}
    return {
        "read": [str(Path.home() / ".ray" / "auth_token"), str(token_file),
                 str(lab.data / "meshyard.db"), str(run / "checkpoints" / "victim.bin"),
                 *(str(p) for p in run.glob("logs/attempt-*/rank-0.stdout")),
                 *(str(p) for p in (lab.data / "packages").glob("*.zip")), *code,
                 "/etc/shadow"],
        "write": [str(run / "checkpoints" / "victim.bin"), str(lab.data / "datasets" / "pwn"),
                  str(token_file), *code, "/etc/meshyard-pwn"],
        "list": [str(lab.data / "runs"), str(lab.data), str(lab.ray_tmp)],
        "ports": sorted(ports),
        "stable_ports": sorted(p for p, name in ports.items()
                               if name in ("gcs_server", "raylet", "meshyard")),
        "unix": [*(str(p) for p in lab.ray_tmp.glob("session_*/sockets/*")), *fork_sockets],
        "pids": sorted(pids),
        "gcs": f"127.0.0.1:{gcs}",
        "ray_tmp": str(lab.ray_tmp),
        "secrets": [lab.admin, lab.victim_secret, lab.store.access_key, lab.store.secret_key],
        "store": {"endpoint": lab.store.endpoint, "bucket": lab.store.bucket},
        "link_target": str(token_file),
    }


VARIANTS = {"command-pooled": (False, False), "function-pooled": (True, False),
            "command-cold": (False, True), "function-cold": (True, True)}


def _wait_pool(lab: Lab, *, idle: int, timeout_s: float = 300) -> None:
    """Until the warm pool has `idle` workers (with their prestarted rank processes) ready."""
    deadline = time.monotonic() + timeout_s
    with MeshyardClient(lab.url, lab.admin) as admin:
        while time.monotonic() < deadline:
            text = admin._http.get("/metrics").text
            ready = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith("meshyard_warm_pool_idle_workers{"))
            if ready >= idle:
                return
            time.sleep(1)
    raise AssertionError(f"the warm pool never had {idle} idle workers")


def _kit_spec(lab: Lab, *, function: bool, cold: bool) -> dict[str, Any]:
    config = lab.targets
    if function:
        ep: dict[str, Any] = {"function": "attack:main", "config": config}
        if cold:
            ep["env"] = {"PYTHONHASHSEED": "7"}  # a start-up variable: no prestarted process
    else:
        ep = {"command": ["python", *(["-u"] if cold else []), "attack.py", json.dumps(config)]}
    ep["working_dir"] = lab.kit
    ep.setdefault("env", {})["KIT_DATA_ROOT"] = str(lab.data / "datasets")
    return {"name": "kit", "resources": {"device": "cpu", "cpus_per_worker": 0.25},
            "entrypoint": ep, "fault_tolerance": {"max_failures": 0}}


@dataclass
class KitRun:
    job: str
    result: dict[str, Any]
    log: str


@pytest.fixture(scope="module")
def kit_runs(lab: Lab) -> dict[str, KitRun]:
    """The four variants, side by side in two rounds: the pooled pair while the pool has a
    prestarted process for each (the victim holds one of the three), then the cold pair."""
    out: dict[str, KitRun] = {}
    with MeshyardClient(lab.url, lab.mallory) as client:
        for cold in (False, True):
            if not cold:
                _wait_pool(lab, idle=2)
            names = [n for n, (_, c) in VARIANTS.items() if c == cold]
            jobs = {n: client.submit(_kit_spec(lab, function=VARIANTS[n][0], cold=cold)).id
                    for n in names}
            for name, job_id in jobs.items():
                done = client.wait(job_id, timeout_s=300)
                lines = [x.line for x in client.logs(job_id, rank=0).items]
                assert done.state.value == "SUCCEEDED", (name, done.message, lines[-20:])
                assert "MESHYARD-ATTACK done" in lines, (name, lines[-20:])
                result = json.loads((lab.data / "runs" / job_id / "attack.json").read_text())
                out[name] = KitRun(job=job_id, result=result, log="\n".join(lines))
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_hostile_job_reaches_nothing_outside_its_own(lab: Lab, kit_runs: dict[str, KitRun],
                                                       variant: str) -> None:
    # The ports that outlive jobs (GCS, raylet, the API) accept a connection from outside
    # the job (a worker's port leaves with its process).
    for port in lab.targets["stable_ports"]:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    run = kit_runs[variant]
    result, own = run.result, run.job
    assert ("starts cold, not prestarted" in run.log) == VARIANTS[variant][1], run.log[-2000:]
    failed_controls = {k: v for k, v in result["controls"].items() if not v["reached"]}
    assert failed_controls == {}
    assert _reached(lab, result["attacks"], own_job=own) == {}
    details = {k: v["detail"] for k, v in result["attacks"].items()}
    # Refused by the confinement, not by chance: Ray's ports by Landlock's TCP rule.
    gcs = int(lab.targets["gcs"].rpartition(":")[2])
    assert details[f"tcp:{gcs}"].startswith("PermissionError"), details[f"tcp:{gcs}"]
    assert details[f"tcp:{_api_port(lab)}"].startswith("PermissionError")
    # The checkpoint store answers the job (it is on the network) but refuses it: the job
    # holds no key, and the store checks every request's signature.
    assert "InvalidAccessKeyId" in details["store:list the bucket with made-up keys"] or \
        "INVALID_ACCESS_KEY_ID" in details["store:list the bucket with made-up keys"], details
    _victim_untouched(lab)


# What a job may see when it lists a directory on the path to its own run dir, code and data
# roots: the mount points of its own view (empty directories), never the real entries.
_VIEW = {"data": {"datasets", "runs"}, "ray_tmp": {"ray"}}


def _sha(path: str) -> str | None:
    try:
        data = Path(path).read_bytes()[:4096]
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest() if data else None


def _reached(lab: Lab, attacks: dict[str, dict[str, Any]], *, own_job: str
             ) -> dict[str, str]:
    """The attempts that reached something real. A read counts when it returned the real
    file's bytes (a hidden file reads as empty, or is absent); a listing when it shows an
    entry of the real directory beyond the job's own view; writes are judged on the host
    (_victim_untouched: a write the job made lands in its own view, not there)."""
    bad: dict[str, str] = {}
    allowed = {str(lab.data): _VIEW["data"], str(lab.ray_tmp): _VIEW["ray_tmp"],
               str(lab.data / "runs"): {own_job}}
    for name, outcome in attacks.items():
        if not outcome["reached"]:
            continue
        kind, _, target = name.partition(":")
        if kind == "read":
            if outcome["value"] == _sha(target):
                bad[name] = "read the real file"
        elif kind == "list":
            real = {p.name for p in Path(target).iterdir()}
            leaked = (set(outcome["value"]) & real) - allowed.get(target, set())
            if leaked:
                bad[name] = f"saw {sorted(leaked)}"
        elif kind != "write":
            bad[name] = outcome["detail"]
    return bad


def _api_port(lab: Lab) -> int:
    return int(lab.url.rpartition(":")[2].rstrip("/"))


def _victim_untouched(lab: Lab) -> None:
    ckpt = lab.data / "runs" / lab.victim / "checkpoints" / "victim.bin"
    assert ckpt.read_bytes() == lab.victim_bytes
    for path, digest in lab.code.items():
        assert _sha(path) == digest, path
    with MeshyardClient(lab.url, lab.alice) as client:
        assert client.get_job(lab.victim).state.value == "RUNNING"
    assert lab.serve.poll() is None
    assert not Path("/etc/meshyard-pwn").exists()
    assert not (lab.data / "datasets" / "pwn").exists()
    assert (lab.data / "admin.token").read_text().strip() == lab.admin


def test_a_hung_hostile_job_cannot_make_the_server_serve_or_unpickle_its_files(
        lab: Lab) -> None:
    marker = Path("/tmp") / f"meshyard-pwned-{secrets.token_hex(6)}"
    token_file = str(lab.data / "admin.token")
    config = {"marker": str(marker), "seconds": 120,
              "artifacts": [token_file, str(lab.data / "meshyard.db")],
              "links": {"stacks.txt": token_file}}
    spec = {"name": "hang", "resources": {"device": "cpu", "cpus_per_worker": 0.5},
            "entrypoint": {"function": "hang:main", "config": config, "working_dir": lab.kit},
            "watchdog": {"stall_timeout_s": 3, "action": "fail"},
            "fault_tolerance": {"max_failures": 0}}
    with MeshyardClient(lab.url, lab.mallory) as client:
        job = client.submit(spec)
        done = client.wait(job.id, timeout_s=240)
        diagnoses = client.diagnoses(job.id).items
        assert diagnoses, (done.state, done.message)
        run = (lab.data / "runs" / job.id).resolve()
        for d in diagnoses:
            artifacts = d.report.get("artifacts") or []
            for path in artifacts:
                assert Path(path).resolve().is_relative_to(run), path
            for i in range(len(artifacts)):
                body = client._http.get(f"/jobs/{job.id}/artifacts/{d.id}/{i}")
                assert lab.admin not in body.text
        # The job tried to leave a link for the server to follow (refused: no links in a
        # run dir) and left its dump where the watchdog reads it.
        out = (run / "logs" / "attempt-1" / "rank-0.stdout").read_text()
        assert "LINK-REFUSED stacks.txt" in out, out[-2000:]
        assert list(run.glob("diagnostics/*/rank0/fr_trace.pkl"))
    assert not marker.exists(), "the hostile Flight Recorder dump ran its command"
    _victim_untouched(lab)


def test_a_broken_upload_is_refused_and_stops_no_one(lab: Lab) -> None:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train.py", "print('x')\n" * 200)
    raw = bytearray(buf.getvalue())
    raw[40] ^= 0xFF  # inside the member's compressed data: its CRC no longer matches
    with MeshyardClient(lab.url, lab.mallory) as client, pytest.raises(MeshyardAPIError) as err:
        client.upload_package(bytes(raw))
    assert err.value.status == 422
    assert not [p for p in (lab.data / "packages").iterdir() if p.name.startswith(".upload")]


def test_the_other_users_jobs_are_still_placed(lab: Lab) -> None:
    spec = {"name": "after", "resources": {"device": "cpu", "cpus_per_worker": 0.5},
            "entrypoint": {"command": ["python", "-c", "print('alice ok')"]}}
    with MeshyardClient(lab.url, lab.alice) as client:
        job = client.submit(spec)
        done = client.wait(job.id, timeout_s=180)
        assert done.state.value == "SUCCEEDED", done.message
        client.cancel(lab.victim)
        assert client.wait(lab.victim, timeout_s=120).state.value == "CANCELLED"
    assert lab.serve.poll() is None
