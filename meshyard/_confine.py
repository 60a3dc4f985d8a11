"""Confining a rank process to its own job, before any user code runs. Standard library only.

`apply(plan)` turns the calling process into a confined one; everything it starts afterwards
inherits the confinement, and nothing it can do undoes it (root included):

1. its own mount namespace (a user namespace too when it is not root), private, where
   - `/tmp` is the job's tmp dir and `/dev/shm` the job's shm dir (shared by the job's ranks
     on the node, no other job's),
   - every path in `plan.hide` (Ray's temp and session dirs with their Unix sockets, Ray's
     token, the control plane's data dir, the runs dir, the package store, host secrets) is
     covered by an empty tmpfs (a file by /dev/null),
   - the job's own run dir (read-write) and code dir (read-only) are bound back where they
     were, and `/proc` shows only the processes this one may trace (hidepid);
2. no capabilities, and no way to get any back (bounding set emptied, securebits locked:
   uid 0 gains nothing on exec), no new privileges;
3. two Landlock layers: TCP bind / connect on every port but `plan.denied_ports` (Ray's
   ports, the control plane's), and files: read and execute everywhere, write only beneath
   the run dir, /tmp, /dev/shm and the device files a job needs; no symbolic links, FIFOs,
   sockets or device nodes made outside /tmp; no signal to a process outside the domain
   (ptrace and /proc/<pid>/environ of other processes are refused by Landlock itself).

Namespaces need a single-threaded caller: a cold rank confines itself in the child between
fork and exec (workers/host/rankproc.py), a prestarted one before its first thread
(meshyard/_prestart.py). Any step that fails raises ConfineError naming the step: a rank
that cannot be confined does not run.

Building the TCP layer costs one syscall per allowed port (~60 ms), so it is built once
(`port_ruleset`) and its descriptor handed to `apply` (`net_fd`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from meshyard import _landlock as ll

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT = 4, 24, 28, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# noroot, no_setuid_fixup, keep_caps (off), no_cap_ambient_raise: each set and locked.
_SECUREBITS = 0b1 | 0b10 | 0b100 | 0b1000 | 0b100000 | 0b1000000 | 0b10000000
_CAP_VERSION_3 = 0x20080522
MAX_PORT = 65535

# Writable places: no symlinks (a reader of the run dir must never be led elsewhere), no
# FIFOs, sockets or device nodes.
WRITE = ll.FS_ALL & ~(ll.MAKE_SYM | ll.MAKE_FIFO | ll.MAKE_SOCK | ll.MAKE_CHAR | ll.MAKE_BLOCK)
TMP_WRITE = WRITE | ll.MAKE_SYM | ll.MAKE_FIFO | ll.MAKE_SOCK
DEVICE = ll.READ_FILE | ll.WRITE_FILE | ll.IOCTL_DEV
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
           "/dev/ptmx", "/dev/pts", "/dev/nvidiactl", "/dev/nvidia-uvm",
           "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia-caps",
           "/dev/infiniband", "/dev/kfd", "/dev/dri")


class ConfineError(RuntimeError):
    """A confinement step failed; the rank must not run."""


@dataclass(frozen=True)
class Plan:
    """Paths are absolute and resolved (no symbolic link) in the caller's view."""

    run_dir: str
    tmp_dir: str  # bound at /tmp
    shm_dir: str | None = None  # bound at /dev/shm
    code_dirs: tuple[str, ...] = ()  # bound back read-only when hidden
    hide: tuple[str, ...] = ()
    denied_ports: tuple[int, ...] = ()
    devices: tuple[str, ...] = DEVICES
    write_dirs: tuple[str, ...] = ()  # more writable dirs (the job's checkpoint storage)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclass
class Report:
    """What `apply` did, for the rank's log."""

    steps: list[str] = field(default_factory=list)


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_ulong, ctypes.c_char_p]
    return _LIBC


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(src: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    _check(_libc().mount(_b(src), _b(target), _b(fstype), flags, _b(data)),
           f"mount {src or fstype or ''} on {target}")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _enter_namespaces() -> None:
    if threads() != 1:
        raise ConfineError(f"a new mount namespace needs a single-threaded process; this one "
                           f"has {threads()} threads")
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        _check(_libc().unshare(CLONE_NEWNS), "unshare(mount namespace)")
        return
    _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWNS),
           "unshare(user + mount namespace): unprivileged user namespaces are off on this "
           "host (sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)")
    # The maps are written through /proc/self, which a process that changed its uid (not
    # dumpable) cannot open.
    _check(_libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _same(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _makedirs(path: str) -> None:
    """Creates the missing directories of `path` without following any symbolic link: the
    job's tmp dir is the job's, and a link its code left there must not lead this (still
    privileged) process elsewhere."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            try:
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # another rank of the job made it
                    os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError as exc:
                raise ConfineError(f"mount point {path}: {part!r} is not a plain directory "
                                   f"({exc.strerror})") from None
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def _hide(paths: Iterable[str], report: Report) -> list[str]:
    """Covers each existing path (outermost first); returns the tmpfs mount points."""
    covered: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered):
            continue
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            _mount("meshyard-hidden", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   "mode=0755,size=1m,nr_inodes=4096")
            covered.append(path)
        elif not stat.S_ISLNK(st.st_mode):
            _mount("/dev/null", path, None, MS_BIND)
        report.steps.append(f"hid {path}")
    return covered


def _bind(fd: int, path: str, *, read_only: bool) -> None:
    _makedirs(path)
    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _mounts(plan: Plan, report: Report) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        keep = {p: os.open(p, flags) for p in (plan.run_dir, *plan.write_dirs, *plan.code_dirs)}
        tmp = os.open(plan.tmp_dir, flags)
        shm = os.open(plan.shm_dir, flags) if plan.shm_dir else None
    except OSError as exc:
        raise ConfineError(f"the job's directories are not all there: {exc}") from None
    try:
        _mount(f"/proc/self/fd/{tmp}", "/tmp", None, MS_BIND | MS_REC)
        if shm is not None:
            _mount(f"/proc/self/fd/{shm}", "/dev/shm", None, MS_BIND | MS_REC)
        _hide(plan.hide, report)
        for path, fd in keep.items():
            if not _same(fd, path):
                _bind(fd, path, read_only=path not in (plan.run_dir, *plan.write_dirs))
                report.steps.append(f"bound {path}")
    finally:
        for fd in (*keep.values(), tmp, *([shm] if shm is not None else [])):
            os.close(fd)
    if os.geteuid() == 0 and _owns_pid_namespace():
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=ptraceable")
        report.steps.append("/proc shows only this job's processes")


def _owns_pid_namespace() -> bool:
    """Root in the initial user namespace may mount a procfs of the current pid namespace."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Every capability gone for good: the bounding set emptied (needs CAP_SETPCAP), the
    securebits locked so uid 0 regains none on exec, ambient and thread sets zeroed."""
    libc = _libc()
    if _capabilities() == 0 and os.geteuid() != 0:
        return  # an unprivileged process without a user namespace has none to drop
    for cap in range(_last_cap() + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0), "lock securebits")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),
           "clear ambient capabilities")
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data), "capset")


def _capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


_RESERVED_PORTS = "/proc/sys/net/ipv4/ip_local_reserved_ports"
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def _parse_ports(text: str) -> set[int]:
    """`1,5-7` -> {1, 5, 6, 7} (the sysctl's format)."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            out.update(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    return out


def _format_ports(ports: Iterable[int]) -> str:
    """{1, 5, 6, 7} -> `1,5-7`."""
    runs: list[list[int]] = []
    for p in sorted(set(ports)):
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def reserve_ephemeral(ports: Iterable[int]) -> int:
    """Takes `ports` out of the kernel's ephemeral port choice in this network namespace
    (net.ipv4.ip_local_reserved_ports; what is reserved already stays). A socket bound to port
    0, as gloo's and NCCL's listeners are, then never gets a port the TCP layer closes, where
    every peer's connect to it would fail with EACCES. Landlock's port rules hold for every
    address, so the closed ports include other hosts' Ray ports, which are free on this one.
    Explicit binds are unaffected. Returns how many ports it newly reserved; -1 where the
    sysctl cannot be read or written (no CAP_NET_ADMIN, a read-only /proc/sys)."""
    try:
        with open(_EPHEMERAL_RANGE) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        with open(_RESERVED_PORTS) as f:
            have = _parse_ports(f.read().strip())
        add = {p for p in ports if lo <= p <= hi} - have
        if add:
            with open(_RESERVED_PORTS, "w") as f:
                f.write(_format_ports(have | add))
        return len(add)
    except (OSError, ValueError):
        return -1


def port_ruleset(denied: Iterable[int], *, version: int | None = None,
                 reserve: bool = True) -> ll.Ruleset:
    """The TCP layer: bind and connect on every port but `denied` (port 0, binding to an
    ephemeral port, included). With `reserve`, the denied ports are also kept out of the
    ephemeral range where this process may say so (`reserve_ephemeral`)."""
    deny = set(denied)
    if reserve:
        reserve_ephemeral(deny)
    rs = ll.Ruleset(net=ll.NET_ALL, version=version)
    rs.allow_ports((p for p in range(MAX_PORT + 1) if p not in deny), ll.NET_ALL)
    return rs


def _file_ruleset(plan: Plan) -> ll.Ruleset:
    rs = ll.Ruleset(fs=ll.FS_ALL, scoped=ll.SCOPE_SIGNAL)
    rs.allow_path("/", ll.FS_READ)
    writable = (plan.run_dir, *plan.write_dirs)
    for path in writable:
        rs.allow_path(path, WRITE)
    # Rules add up along a path: a run dir that lies under /tmp would get /tmp's links.
    under_tmp = any(p == "/tmp" or p.startswith("/tmp/") for p in writable)
    rs.allow_path("/tmp", WRITE if under_tmp else TMP_WRITE)
    if os.path.isdir("/dev/shm"):
        rs.allow_path("/dev/shm", WRITE)
    for dev in plan.devices:
        if os.path.exists(dev):
            rs.allow_path(dev, DEVICE)
    for name in _nvidia_devices():
        rs.allow_path(name, DEVICE)
    return rs


def _nvidia_devices() -> list[str]:
    try:
        return [f"/dev/{n}" for n in os.listdir("/dev") if n.startswith("nvidia")
                and n[6:].isdigit()]
    except OSError:
        return []


def self_test(scratch: str) -> list[str]:
    """Whether this host can confine a rank: a child process applies a plan in `scratch`
    (an empty directory) and checks that a hidden file, a closed port and a process outside
    are out of its reach. Returns what failed ([] when everything held)."""
    import socket

    version = ll.abi()
    if version < ll.SCOPE_SINCE:
        return [f"the kernel's Landlock is ABI {version}; confining a job's TCP connections "
                f"and signals needs ABI {ll.SCOPE_SINCE} (Linux >= 6.12)"]
    run, tmp, hidden = (os.path.join(scratch, n) for n in ("run", "tmp", "hidden"))
    for d in (run, tmp, hidden):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(hidden, "secret"), "w") as f:
        f.write("x")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        net = port_ruleset((port,), reserve=False)  # the test's port is its own, held by it
    except OSError as exc:
        server.close()
        return [f"the TCP layer could not be built: {exc}"]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: confine, try, report, exit
        os.close(read)
        problems = []
        try:
            apply(Plan(run_dir=run, tmp_dir=tmp, hide=(hidden,), denied_ports=(port,)),
                  net_fd=net.fd)
            if os.path.exists(os.path.join(hidden, "secret")):
                problems.append("a hidden file stayed visible")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                problems.append("a closed TCP port stayed reachable")
            except OSError:
                pass
            try:
                os.kill(os.getppid(), 0)
                problems.append("a process outside the job could be signalled")
            except OSError:
                pass
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            problems.append(str(exc))
        os.write(write, json.dumps(problems).encode())
        os._exit(0)
    os.close(write)
    net.close()
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    server.close()
    try:
        return [str(p) for p in json.loads(data)]
    except ValueError:
        return ["the confinement test process ended without an answer"]


def apply(plan: Plan, *, net_fd: int | None = None) -> Report:
    """Confines the calling process (see the module doc). `net_fd`: a `port_ruleset` built
    ahead for `plan.denied_ports`; without it the TCP layer is built here."""
    report = Report()
    net: ll.Ruleset | None = None
    try:
        # Built while the process may still reserve the denied ports (see port_ruleset).
        net = ll.Ruleset.adopt(net_fd) if net_fd is not None else \
            port_ruleset(plan.denied_ports)
        _enter_namespaces()
        _mounts(plan, report)
        drop_capabilities()
        # The file layer first: each new layer copies the rules of those before it, and the
        # TCP layer holds ~65,000.
        with _file_ruleset(plan) as files:
            files.restrict()
        net.restrict()
    except ConfineError:
        raise
    except OSError as exc:
        raise ConfineError(f"confinement failed: {exc}") from None
    finally:
        if net is not None:
            net.close()
    report.steps.append(f"no capabilities; TCP closed on {len(set(plan.denied_ports))} ports; "
                        "files: write only the run dir, /tmp and /dev/shm; no signals out")
    return report
