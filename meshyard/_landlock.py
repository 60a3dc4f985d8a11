"""Landlock, the kernel's unprivileged sandbox (Linux >= 5.13), through its three syscalls.
Standard library only: the rank process confines itself with it before any user code runs
(meshyard/_confine.py) and the control plane confines the embedded Ray with it
(orchestrator/runtime/sandbox.py).

A ruleset says which accesses it handles (filesystem rights, TCP bind / connect, scopes);
rules grant some of them beneath a directory or on a TCP port; `restrict()` makes the calling
thread (and everything it starts afterwards) a new domain where every handled access that no
rule grants is refused. Layers stack: a second ruleset can only take more away.

    with Ruleset(fs=FS_ALL, net=NET_ALL, scoped=SCOPE_SIGNAL) as rs:
        rs.allow_path("/", FS_READ)
        rs.allow_ports(range(1, 1024), NET_ALL)
        rs.restrict()

The kernel's ABI (`abi()`) says which rights exist: 4 adds TCP rules, 6 the signal and
abstract-socket scopes. Rights a kernel does not know are dropped from what is handled.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Iterable

_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # x86_64 and arm64 alike
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_CREATE_RULESET_VERSION = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15

FS_READ = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # valid on a file
FS_ALL = (1 << 16) - 1

NET_BIND, NET_CONNECT = 1 << 0, 1 << 1
NET_ALL = NET_BIND | NET_CONNECT

SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

# The first ABI that knows each right or scope.
_FS_SINCE = {REFER: 2, TRUNCATE: 3, IOCTL_DEV: 5}
NET_SINCE, SCOPE_SINCE = 4, 6


class _Attr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _error(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def known_fs(rights: int, version: int) -> int:
    """`rights` less those the kernel's ABI `version` does not know."""
    known = (1 << 13) - 1  # ABI 1: execute ... make_sym
    for bit, since in _FS_SINCE.items():
        if version >= since:
            known |= bit
    return rights & known


def no_new_privs() -> None:
    """No exec may grant privileges from here on (setuid bits, file capabilities)."""
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_NO_NEW_PRIVS)")


class Ruleset:
    """One ruleset fd. `fs` / `net` / `scoped`: what it handles (unknown bits dropped)."""

    def __init__(self, *, fs: int = 0, net: int = 0, scoped: int = 0,
                 version: int | None = None) -> None:
        self.version = abi() if version is None else version
        if self.version < 1:
            raise OSError("Landlock is not available on this kernel")
        if net and self.version < NET_SINCE:
            raise OSError(f"this kernel's Landlock (ABI {self.version}) has no TCP rules "
                          f"(ABI {NET_SINCE}, Linux 6.7)")
        if scoped and self.version < SCOPE_SINCE:
            raise OSError(f"this kernel's Landlock (ABI {self.version}) has no scopes "
                          f"(ABI {SCOPE_SINCE}, Linux 6.12)")
        self.fs = known_fs(fs, self.version)
        self.net, self.scoped = net, scoped
        attr = _Attr(self.fs, net, scoped)
        size = ctypes.sizeof(attr) if scoped else (16 if net else 8)
        fd = _libc().syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        if fd < 0:
            raise _error("landlock_create_ruleset")
        self.fd: int | None = fd

    @classmethod
    def adopt(cls, fd: int) -> Ruleset:
        """A ruleset built elsewhere (an inherited descriptor), for restrict()."""
        out = cls.__new__(cls)
        out.version, out.fs, out.net, out.scoped, out.fd = abi(), 0, 0, 0, fd
        return out

    def allow_path(self, path: str | os.PathLike[str], rights: int) -> None:
        """Grants `rights` (of those handled) beneath `path` (on it, for a file)."""
        assert self.fd is not None
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            granted = rights & self.fs
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                granted &= FILE_RIGHTS
            if not granted:
                return
            rule = _PathBeneath(granted, fd)
            if _libc().syscall(_SYS_ADD_RULE, self.fd, _RULE_PATH_BENEATH, ctypes.byref(rule),
                               0) < 0:
                raise _error(f"landlock_add_rule {path}")
        finally:
            os.close(fd)

    def allow_ports(self, ports: Iterable[int], rights: int) -> None:
        """Grants `rights` (NET_BIND / NET_CONNECT) on each TCP port (0: binding to an
        ephemeral port)."""
        assert self.fd is not None
        rule = _NetPort(rights & self.net, 0)
        ref, call, fd = ctypes.byref(rule), _libc().syscall, self.fd
        for port in ports:
            rule.port = port
            if call(_SYS_ADD_RULE, fd, _RULE_NET_PORT, ref, 0) < 0:
                raise _error(f"landlock_add_rule port {port}")

    def restrict(self) -> None:
        """Makes the calling thread a new domain (sets no_new_privs first)."""
        assert self.fd is not None
        no_new_privs()
        if _libc().syscall(_SYS_RESTRICT, self.fd, 0) < 0:
            raise _error("landlock_restrict_self")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Ruleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
