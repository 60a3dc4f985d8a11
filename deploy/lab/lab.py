"""A multi-host lab on one machine: N hosts as Linux network namespaces on a bridge.

Every name this module makes starts with PREFIX ("myl-"), and `down()` removes by those names
and by recorded PID, so it also cleans up after a crashed `up()` or test run:

  bridge        myl-br0 (root namespace, no address, no IPv6 link-local either on it or on
                the root-side veths: the lab network routes nowhere)
  host i        network namespace myl-h<i>, veth myl-h<i> (root side, on the bridge) /
                eth0 (inside) with 198.18.0.(10+i)/24, its own loopback
  host disk     a tmpfs mounted on RUN_DIR inside the host's own mount namespace (held by a
                `sleep` keeper process that also owns its UTS namespace, hostname myl-h<i>):
                what one host writes under RUN_DIR the others, and the root namespace, never see
  storage       a tmpfs on STORAGE_DIR in the root namespace, mounted before the hosts are made,
                so every host sees the same one at the same path: the cluster's shared
                checkpoint storage, as an NFS mount is on a real cluster
  /etc/hosts    bind-mounted in each host's mount namespace: every lab host's name and address
  nvidia-smi    a stand-in on the host's PATH that prints a real `nvidia-smi topo -m` capture
  Ray           deploy/baremetal/ray-node.sh, head on host 1, workers on the others, with the
                host's address, declared GPUs (the capture's count), labels and one auth token
  state         STATE_DIR/state.json (0600): hosts, addresses, PIDs with their start times

Processes run in a host through `nsenter` into the keeper's network, mount and UTS namespaces.
Nothing here ever stops Ray machine-wide (Ray's own stop command ends every Ray process on the
machine, in every namespace): a host's processes are found by PID, recorded ones and
`ip netns pids`, and killed.

  python deploy/lab/lab.py up [--hosts N]     bring a lab up and leave it running
  python deploy/lab/lab.py status             hosts, addresses, live PIDs
  python deploy/lab/lab.py exec myl-h2 -- CMD run CMD inside a host
  python deploy/lab/lab.py down               remove everything the lab made (idempotent)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

PREFIX = "myl-"
BRIDGE = f"{PREFIX}br0"
SUBNET = "198.18.0"  # RFC 2544 benchmarking range: never routed anywhere
STATE_DIR = Path(f"/tmp/{PREFIX}lab")
RUN_DIR = f"/tmp/{PREFIX}run"  # the mount point of every host's private disk
RUN_DISK_SIZE = "1g"
STORAGE_DIR = f"/tmp/{PREFIX}storage"  # every host's shared storage (checkpoints)
STORAGE_SIZE = "256m"
RAY_PORT = 6380  # inside the head's own network namespace: nothing else listens there

REPO = Path(__file__).resolve().parents[2]
RAY_NODE_SH = REPO / "deploy" / "baremetal" / "ray-node.sh"
RESTART_SEC = 5  # the bare-metal units' RestartSec
SAMPLES = Path(os.environ.get("MESHYARD_LAB_TOPO_DIR", "/work/shared/samples/topo"))
DEFAULT_TOPOS = ("topo_h100_4gpu_nv6_4nics_sparse_cpu_affinity.txt",
                 "topo_dgx_a100_8gpu_nv12_12mlx5_numa_3_1_7_5.txt",
                 "topo_h100_8gpu_nv18_no_nics.txt")
MAX_HOSTS = 9  # addresses 198.18.0.11 .. 198.18.0.19


class LabError(RuntimeError):
    pass


@dataclass
class Host:
    name: str  # also its network namespace, root-side veth and hostname
    ip: str
    role: str  # "head" | "worker" | "plain" (no Ray)
    labels: dict[str, str]
    gpus: int = 0
    topo: str | None = None  # the capture its nvidia-smi prints
    keeper: tuple[int, int] | None = None  # (pid, start time) of the namespace holder
    pids: list[tuple[int, int]] = field(default_factory=list)  # processes started in it

    @property
    def dir(self) -> Path:
        return STATE_DIR / self.name


def _sh(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{shlex.join(argv)} exited {proc.returncode}: "
                       f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): with the PID it
    names one process, so a recorded PID the kernel has since reused is never signalled.
    None when it has exited, a zombie included (a child the lab keeps a handle on, such as
    a host's ray-node.sh, stays one until that handle is polled)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _alive(rec: Sequence[int]) -> bool:
    return _start_time(rec[0]) == rec[1]


def _record(pid: int) -> tuple[int, int]:
    start = _start_time(pid)
    if start is None:
        raise LabError(f"process {pid} exited at once")
    return pid, start


def lab_available() -> str | None:
    """None when this machine can build a lab, else why not."""
    if os.geteuid() != 0:
        return "the lab needs root (network and mount namespaces)"
    for tool in ("ip", "nsenter", "unshare", "tc"):
        if _sh(["sh", "-c", f"command -v {tool}"], check=False).returncode != 0:
            return f"{tool} is not installed"
    if _sh(["ip", "netns", "list"], check=False).returncode != 0:
        return "`ip netns` is unavailable"
    return None


def netns_pids(name: str) -> set[int]:
    proc = _sh(["ip", "netns", "pids", name], check=False)
    return {int(p) for p in proc.stdout.split()} if proc.returncode == 0 else set()


def lab_netns() -> list[str]:
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.strip() and line.split()[0].startswith(PREFIX)]


def lab_links() -> list[str]:
    out = _sh(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                names.append(name)
    return names


class Lab:
    def __init__(self, hosts: list[Host], token: str) -> None:
        self.hosts = hosts
        self.token = token
        # each host's running ray-node.sh and the arguments it was started with
        self._ray: dict[str, tuple[subprocess.Popen[bytes], int | None, int | None]] = {}

    # ---- lookups -------------------------------------------------------------------------
    def host(self, host: str | Host) -> Host:
        if isinstance(host, Host):
            return host
        for h in self.hosts:
            if h.name == host or h.name == f"{PREFIX}{host}":
                return h
        raise LabError(f"no lab host {host!r}")

    @property
    def head(self) -> Host:
        return next(h for h in self.hosts if h.role == "head")

    @property
    def ray_address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    # ---- state ---------------------------------------------------------------------------
    def save(self) -> None:
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        path = STATE_DIR / "state.json"
        doc = {"token": self.token, "hosts": [asdict(h) for h in self.hosts]}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)

    @classmethod
    def load(cls) -> Lab | None:
        try:
            doc = json.loads((STATE_DIR / "state.json").read_text())
        except (OSError, ValueError):
            return None
        hosts = []
        for d in doc["hosts"]:
            d["keeper"] = tuple(d["keeper"]) if d.get("keeper") else None
            d["pids"] = [tuple(p) for p in d.get("pids", [])]
            hosts.append(Host(**d))
        return cls(hosts, doc["token"])

    # ---- running things in a host --------------------------------------------------------
    def env(self, host: str | Host, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A host's environment as a bare-metal operator's unit would give it: no variable of
        the calling process leaks in (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, RAY_ADDRESS, ...)."""
        h = self.host(host)
        venv_bin = Path(sys.executable).parent
        env = {
            "PATH": f"{h.dir / 'bin'}:{venv_bin}:/usr/local/sbin:/usr/local/bin:"
                    "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "TMPDIR": RUN_DIR,
            "RAY_TMPDIR": RUN_DIR,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": str(REPO),
            "MESHYARD_LAB_HOST": h.name,
            "MESHYARD_LAB_IP": h.ip,
        }
        env.update(extra or {})
        return env

    def _nsenter(self, h: Host, argv: Sequence[str], cwd: str | None) -> list[str]:
        if h.keeper is None or not _alive(h.keeper):
            raise LabError(f"{h.name} is not running (its namespaces are gone)")
        return ["nsenter", "-t", str(h.keeper[0]), "-n", "-m", "-u",
                f"--wd={cwd or str(REPO)}", "--", *argv]

    def run_in(self, host: str | Host, argv: Sequence[str], *, timeout: float = 120,
               env: Mapping[str, str] | None = None, check: bool = False,
               cwd: str | None = None, input: str | None = None,
               ) -> subprocess.CompletedProcess[str]:
        """Run argv inside a host and wait for it (stdout/stderr captured as text)."""
        h = self.host(host)
        proc = subprocess.run(self._nsenter(h, argv, cwd), env=self.env(h, env), text=True,
                              capture_output=True, timeout=timeout, input=input, check=False)
        if check and proc.returncode != 0:
            raise LabError(f"{h.name}: {shlex.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
        return proc

    def spawn_in(self, host: str | Host, argv: Sequence[str], *, log: str,
                 env: Mapping[str, str] | None = None, cwd: str | None = None
                 ) -> subprocess.Popen[bytes]:
        """Start argv inside a host in the background, output to the host's log file `log`
        (under STATE_DIR/<host>/, readable from the root namespace); its PID is recorded."""
        h = self.host(host)
        with open(h.dir / log, "ab") as out:
            proc = subprocess.Popen(self._nsenter(h, argv, cwd), env=self.env(h, env),
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        h.pids.append(_record(proc.pid))
        self.save()
        return proc

    def python_in(self, host: str | Host, code: str, *, timeout: float = 120,
                  env: Mapping[str, str] | None = None, check: bool = False
                  ) -> subprocess.CompletedProcess[str]:
        return self.run_in(host, [sys.executable, "-c", code], timeout=timeout, env=env,
                           check=check)

    def tcp_connects(self, src: str | Host, ip: str, port: int, timeout: float = 3.0) -> bool:
        """Whether a TCP connect from inside `src` to ip:port succeeds within `timeout`."""
        code = (f"import socket\ntry:\n socket.create_connection(({ip!r}, {port}), "
                f"timeout={timeout}).close(); print('ok')\nexcept OSError as e: print(e)")
        out = self.python_in(src, code, timeout=timeout + 30).stdout.strip()
        return out == "ok"

    # ---- faults --------------------------------------------------------------------------
    def link_down(self, host: str | Host) -> None:
        """The host's cable pulled: its bridge port goes down, so eth0 inside loses carrier."""
        _sh(["ip", "link", "set", self.host(host).name, "down"])

    def link_up(self, host: str | Host) -> None:
        _sh(["ip", "link", "set", self.host(host).name, "up"])

    def slow_link(self, host: str | Host, rate: str | None, *, burst: str = "32kbit",
                  latency: str = "400ms") -> None:
        """Shape the host's link to `rate` (tc syntax, e.g. "4mbit") both ways with a token
        bucket; rate None removes the shaping."""
        h = self.host(host)
        sides = (["tc"], ["ip", "netns", "exec", h.name, "tc"])
        devs = (h.name, "eth0")
        for tc, dev in zip(sides, devs, strict=True):
            if rate is None:
                _sh([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                _sh([*tc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                     "burst", burst, "latency", latency])

    def fill_disk(self, host: str | Host, path: str) -> int:
        """Fill the filesystem of `path` as seen from `host` (its private RUN_DIR disk, or the
        shared STORAGE_DIR) to 100 % with one file, `<path>/.lab-fill`; returns its bytes.
        `free_disk` removes it."""
        fill = f"{path}/.lab-fill"
        self.run_in(host, ["sh", "-c", f"dd if=/dev/zero of={shlex.quote(fill)} bs=1M "
                           "status=none 2>/dev/null; sync"], timeout=120)
        out = self.run_in(host, ["stat", "-c", "%s", fill], check=True).stdout
        return int(out.strip())

    def free_disk(self, host: str | Host, path: str) -> None:
        self.run_in(host, ["rm", "-f", f"{path}/.lab-fill"], check=True)

    def host_pids(self, host: str | Host) -> set[int]:
        """Every live process of the host but its keeper: recorded ones and every process in
        its network namespace (Ray's raylet, workers, and what they started)."""
        h = self.host(host)
        pids = {p for p, s in h.pids if _start_time(p) == s} | netns_pids(h.name)
        if h.keeper is not None:
            pids.discard(h.keeper[0])
        return pids

    def kill_host(self, host: str | Host, *, wait_s: float = 10.0) -> set[int]:
        """SIGKILL every process of the host (its keeper, which holds the namespaces and the
        disk, stays); returns the PIDs killed."""
        h = self.host(host)
        killed: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.host_pids(h)
            if not pids:
                return killed
            if time.monotonic() > deadline:
                raise LabError(f"{h.name}: processes {sorted(pids)} survive SIGKILL")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    # ---- Ray -----------------------------------------------------------------------------
    def start_ray(self, host: str | Host, *, cpus: int | None = None,
                  gpus: int | None = None) -> subprocess.Popen[bytes]:
        """ray-node.sh on the host: `head` on the head, `worker` elsewhere (a plain host joins
        as a worker, e.g. with cpus=0, gpus=0 for a control plane's driver)."""
        h = self.host(host)
        role = "head" if h.role == "head" else "worker"
        env = {
            "MESHYARD_BIN": str(Path(sys.executable).parent),
            "MESHYARD_NODE_NAME": h.name,
            "MESHYARD_NODE_LABELS": ",".join(f"{k}={v}" for k, v in h.labels.items()),
            "MESHYARD_NODE_LABELS_FILE": str(h.dir / "node-labels"),  # absent: none
            "RAY_NODE_IP": h.ip,
            "RAY_NUM_GPUS": str(h.gpus if gpus is None else gpus),
            "RAY_PORT": str(RAY_PORT),
            "RAY_HEAD_ADDRESS": self.ray_address,
            # no dashboard: its processes on the head would serve nothing here
            "RAY_DASHBOARD": "0",
        }
        if cpus is not None:
            env["RAY_NUM_CPUS"] = str(cpus)
        proc = self.spawn_in(h, ["bash", str(RAY_NODE_SH), role], log="ray-node.log", env=env)
        self._ray[h.name] = (proc, cpus, gpus)
        return proc

    def restart_failed_starts(self) -> list[str]:
        """Starts Ray again on each host whose ray-node.sh has exited, as the bare-metal
        units do (Restart=on-failure): `ray start` gives up when its raylet has not
        registered within 30 s, which a loaded machine can exceed. What the failed start left
        running on the host is killed first. Returns the hosts restarted."""
        restarted = []
        for name, (proc, cpus, gpus) in list(self._ray.items()):
            if proc.poll() is None:
                continue
            self.kill_host(name)
            time.sleep(RESTART_SEC)
            self.start_ray(name, cpus=cpus, gpus=gpus)
            restarted.append(name)
        return restarted

    def wait_port(self, host: str | Host, port: int, timeout: float = 60) -> None:
        h = self.host(host)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = self.run_in(h, ["bash", "-c", f"echo >/dev/tcp/{h.ip}/{port}"],
                                timeout=10)
            if probe.returncode == 0:
                return
            time.sleep(0.5)
        raise LabError(f"{h.name}: nothing listens on {h.ip}:{port} after {timeout:g}s; "
                       f"{self.log_tail(h, 'ray-node.log')}")

    def wait_nodes(self, count: int, timeout: float = 300) -> None:
        """Wait until the head's Ray sees `count` live nodes, starting Ray again on a host
        whose start failed (`restart_failed_starts`), in rounds of at most a minute."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._wait_nodes(count, timeout=max(1.0, min(60.0, left)))
                return
            except LabError:
                if time.monotonic() >= deadline:
                    raise
                self.restart_failed_starts()

    def _wait_nodes(self, count: int, timeout: float) -> None:
        """One driver on the head waits up to `timeout` for `count` live nodes."""
        code = f"""
import time, ray
ray.init(address={self.ray_address!r}, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + {timeout}
while time.monotonic() < deadline:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= {count}:
        print(len(alive)); break
    time.sleep(0.5)
else:
    raise SystemExit(f"{{len(alive)}} of {count} Ray nodes alive")
"""
        proc = self.python_in(self.head, code, timeout=timeout + 60)
        if proc.returncode != 0:
            tails = "; ".join(self.log_tail(h, "ray-node.log") for h in self.hosts
                              if h.role in ("head", "worker"))
            raise LabError(f"Ray cluster did not form: {proc.stderr.strip()[-1500:]}; {tails}")

    def log_tail(self, host: str | Host, log: str, lines: int = 15) -> str:
        h = self.host(host)
        try:
            text = (h.dir / log).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"{h.name}/{log}: (no log)"
        return f"{h.name}/{log}:\n" + "\n".join(text)


def _gpu_count(capture: Path) -> int:
    from orchestrator.topology.nvidia_smi import parse_topo_matrix

    return len(parse_topo_matrix(capture.read_text()).gpus)


def _fake_nvidia_smi(h: Host) -> None:
    bindir = h.dir / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"# lab stand-in: prints the real capture {h.topo}\n"
        'if [ "$1" = topo ] && [ "$2" = -m ]; then\n'
        f"  exec cat {shlex.quote(str(SAMPLES / h.topo))}\n"  # type: ignore[operator]
        "fi\n"
        'echo "nvidia-smi (lab stand-in): only topo -m is available" >&2\n'
        "exit 9\n")
    script.chmod(0o755)


def _quiet_link(name: str) -> None:
    """No IPv6 link-local address on a root-namespace lab link: the lab's links then add,
    pull and remove no address in the machine's own namespace, where a browser (Chromium
    aborts its in-flight requests with ERR_NETWORK_CHANGED on an address change) or a network
    manager would take a lab host's cable for a change of the machine's network."""
    _sh(["ip", "link", "set", "dev", name, "addrgenmode", "none"])


def _make_host(h: Host) -> None:
    """The host's network namespace, link and address, and its keeper (mount + UTS
    namespace with the private disk on RUN_DIR)."""
    _sh(["ip", "netns", "add", h.name])
    _sh(["ip", "link", "add", h.name, "type", "veth", "peer", "name", "eth0",
         "netns", h.name])
    _quiet_link(h.name)
    _sh(["ip", "link", "set", h.name, "master", BRIDGE])
    _sh(["ip", "link", "set", h.name, "up"])
    _sh(["ip", "-n", h.name, "addr", "add", f"{h.ip}/24", "dev", "eth0"])
    _sh(["ip", "-n", h.name, "link", "set", "eth0", "up"])
    _sh(["ip", "-n", h.name, "link", "set", "lo", "up"])
    setup = (f"mount -t tmpfs -o size={RUN_DISK_SIZE},mode=1777 {h.name}-run {RUN_DIR} "
             f"&& mount --bind -o ro {STATE_DIR / 'hosts'} /etc/hosts "
             f"&& hostname {h.name} && exec sleep infinity")
    keeper = subprocess.Popen(
        ["ip", "netns", "exec", h.name, "unshare", "--mount", "--uts",
         "--propagation", "private", "sh", "-c", setup],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(h.dir / "keeper.log", "ab"), start_new_session=True)  # noqa: SIM115
    h.keeper = _record(keeper.pid)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if keeper.poll() is not None:
            raise LabError(f"{h.name}: namespace keeper exited {keeper.returncode}: "
                           f"{(h.dir / 'keeper.log').read_text().strip()}")
        try:
            comm = Path(f"/proc/{keeper.pid}/comm").read_text().strip()
            mounts = Path(f"/proc/{keeper.pid}/mountinfo").read_text()
        except OSError:
            comm, mounts = "", ""
        if comm == "sleep" and f" {RUN_DIR} " in mounts:
            h.keeper = _record(keeper.pid)
            return
        time.sleep(0.05)
    raise LabError(f"{h.name}: private disk not mounted after 20 s")


def up(n: int = 2, *, ray: bool = True, plain: int = 0,
       topos: Sequence[str] = DEFAULT_TOPOS) -> Lab:
    """Build n Ray hosts (head on the first) plus `plain` hosts without Ray (a control
    plane's own host); on any failure everything made so far is removed."""
    why = lab_available()
    if why:
        raise LabError(why)
    total = n + plain
    if not 1 <= total <= MAX_HOSTS:
        raise LabError(f"1 to {MAX_HOSTS} hosts, not {total}")
    if (BRIDGE in lab_links() or lab_netns() or (STATE_DIR / "state.json").exists()
            or _mounted(STORAGE_DIR)):
        raise LabError(f"a lab is already up ({BRIDGE}, {PREFIX}* namespaces or "
                       f"{STATE_DIR}); remove it with `make lab-down`")
    hosts = []
    for i in range(1, total + 1):
        role = ("head" if i == 1 else "worker") if (ray and i <= n) else "plain"
        topo = topos[(i - 1) % len(topos)] if i <= n else None
        hosts.append(Host(name=f"{PREFIX}h{i}", ip=f"{SUBNET}.{10 + i}", role=role,
                          labels={"leaf": f"leaf-{'ab'[(i - 1) % 2]}", "spine": "spine-0"},
                          topo=topo, gpus=_gpu_count(SAMPLES / topo) if topo else 0))
    lab = Lab(hosts, secrets.token_hex(32))
    try:
        lab.save()
        Path(RUN_DIR).mkdir(exist_ok=True)
        Path(STORAGE_DIR).mkdir(exist_ok=True)
        _sh(["mount", "-t", "tmpfs", "-o", f"size={STORAGE_SIZE},mode=1777",
             f"{PREFIX}storage", STORAGE_DIR])
        (STATE_DIR / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{h.ip} {h.name}\n" for h in hosts))
        _sh(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _quiet_link(BRIDGE)
        _sh(["ip", "link", "set", BRIDGE, "up"])
        for h in hosts:
            h.dir.mkdir(exist_ok=True)
            if h.topo:
                _fake_nvidia_smi(h)
            _make_host(h)
            lab.save()
        ray_hosts = [h for h in hosts if h.role in ("head", "worker")]
        if ray_hosts:
            lab.start_ray(lab.head)
            lab.wait_port(lab.head, RAY_PORT)
            for h in ray_hosts[1:]:
                lab.start_ray(h)
            lab.wait_nodes(len(ray_hosts))
    except BaseException:
        down()
        raise
    return lab


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def _kill_all(recs: Iterable[tuple[int, int]], netns: Iterable[str], wait_s: float) -> None:
    netns = list(netns)
    deadline = time.monotonic() + wait_s
    while True:
        pids = {p for p, s in recs if _start_time(p) == s}
        for ns in netns:
            pids |= netns_pids(ns)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def down(wait_s: float = 15.0) -> list[str]:
    """Remove every process, namespace, link and directory the lab made, by recorded PID and
    by name; safe to call when nothing (or half a lab) is up. Returns what was left behind
    (empty when clean)."""
    lab = Lab.load()
    recs: list[tuple[int, int]] = []
    if lab is not None:
        for h in lab.hosts:
            recs += list(h.pids) + ([h.keeper] if h.keeper else [])
    names = set(lab_netns()) | ({h.name for h in lab.hosts} if lab else set())
    _kill_all(recs, [ns for ns in names if ns in lab_netns()], wait_s)
    for ns in lab_netns():
        _sh(["ip", "netns", "del", ns], check=False)
    for link in lab_links():
        _sh(["ip", "link", "del", link], check=False)
    if STATE_DIR.exists():
        _sh(["rm", "-rf", "--one-file-system", str(STATE_DIR)], check=False)
    if _mounted(STORAGE_DIR):  # the hosts' copies went with their keepers
        _sh(["umount", STORAGE_DIR], check=False)
    for mount_point in (RUN_DIR, STORAGE_DIR):
        with contextlib.suppress(OSError):  # not there, or not empty: reported below
            os.rmdir(mount_point)
    left = [f"netns {ns}" for ns in lab_netns()] + [f"link {ln}" for ln in lab_links()]
    left += [f"pid {p}" for p, s in recs if _start_time(p) == s]
    left += [f"path {p}" for p in (STATE_DIR, Path(RUN_DIR), Path(STORAGE_DIR)) if p.exists()]
    left += [f"mount {STORAGE_DIR}"] if _mounted(STORAGE_DIR) else []
    return left


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="bring a lab up and leave it running")
    p_up.add_argument("--hosts", type=int, default=3, help="Ray hosts (head + workers)")
    p_up.add_argument("--plain", type=int, default=0, help="extra hosts without Ray")
    sub.add_parser("down", help="remove everything the lab made")
    sub.add_parser("status", help="hosts, addresses and live PIDs")
    p_ex = sub.add_parser("exec", help="run a command inside a host")
    p_ex.add_argument("host")
    p_ex.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.cmd == "up":
        t0 = time.monotonic()
        lab = up(args.hosts, plain=args.plain)
        print(f"lab up in {time.monotonic() - t0:.1f}s; Ray head {lab.ray_address}")
        args.cmd = "status"
    if args.cmd == "down":
        left = down()
        print("lab down" + (f"; left behind: {', '.join(left)}" if left else ""))
        return 1 if left else 0
    lab = Lab.load()
    if lab is None:
        print("no lab is up", file=sys.stderr)
        return 1
    if args.cmd == "status":
        for h in lab.hosts:
            live = "up" if h.keeper and _alive(h.keeper) else "gone"
            print(f"{h.name:8} {h.ip:14} {h.role:6} {live:4} pids={sorted(lab.host_pids(h))} "
                  f"labels={h.labels} gpus={h.gpus}")
        return 0
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    proc = subprocess.run(lab._nsenter(lab.host(args.host), argv or ["bash"], None),
                          env=lab.env(args.host), check=False)
    return proc.returncode


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(_main())
