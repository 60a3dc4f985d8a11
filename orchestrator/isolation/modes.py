"""Tenant isolation: the mode a deployment runs in and what it asks of every rank. Pure module.

`isolated` (the default): every rank process of user code (a command or a function) is
confined to its own job before the user's code runs (meshyard/_confine.py): it reaches no Ray
endpoint (TCP or Unix socket), no Ray token or session dir, no file of the control plane or of
another job, no process outside its job, and has no capability, root included. The control
plane checks at start that this host can enforce it (`host_problems`); where it cannot,
non-admin users' code is refused with the reason. Each rank checks again on its node and does
not run unconfined.

`trusted`: nothing is confined; any user's code can act as admin (it can reach Ray, and
through Ray the control plane). For single-team clusters only; the server says so at start,
on `/v1/cluster` and in the README.

    JobConfinement(mode=IsolationMode.ISOLATED, hide=("/srv/meshyard",),
                   denied_ports=(8470,), read_only=("/data/datasets",))
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Host files no job needs and every root process could read: password hashes, the host's
# SSH keys. Hidden from every rank (a file is covered by /dev/null, a dir by an empty one).
HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/ssh", "/etc/sudoers", "/etc/sudoers.d")


class IsolationMode(StrEnum):
    ISOLATED = "isolated"
    TRUSTED = "trusted"


TRUSTED_WARNING = ("isolation is 'trusted': jobs' code is not confined, so any user who may "
                   "run code can reach Ray and act as admin; use it only where every user is "
                   "trusted (MESHYARD_ISOLATION=isolated confines jobs)")


@dataclass(frozen=True)
class JobConfinement:
    """What the control plane asks of every rank of a job (the node adds Ray's own ports,
    dirs and token, workers/host/confinement.py).

    hide: paths of the control plane (data dir, runs dir, package store) and the operator's
    denied_ports: TCP ports of the control plane (its API, its database)
    read_only: dirs the job may read although they lie under a hidden one (the data roots)
    """

    mode: IsolationMode = IsolationMode.ISOLATED
    hide: tuple[str, ...] = ()
    denied_ports: tuple[int, ...] = ()
    read_only: tuple[str, ...] = ()

    @property
    def confined(self) -> bool:
        return self.mode is IsolationMode.ISOLATED


@dataclass(frozen=True)
class HostCheck:
    """Whether this host can confine ranks: `problems` is empty when it can."""

    landlock_abi: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.ok:
            return (f"isolated: rank processes are confined (Landlock ABI {self.landlock_abi}, "
                    "mount namespaces, no capabilities)")
        return "isolated, but this host cannot confine jobs: " + "; ".join(self.problems)


MIN_LANDLOCK_ABI = 6  # TCP rules (4) and the signal scope (6)


def landlock_problem(abi: int) -> str | None:
    if abi >= MIN_LANDLOCK_ABI:
        return None
    if abi == 0:
        return "the kernel has no Landlock (Linux >= 6.12 with CONFIG_SECURITY_LANDLOCK and " \
               "landlock in the lsm= boot list)"
    return (f"the kernel's Landlock is ABI {abi}; confining a job's TCP connections and "
            f"signals needs ABI {MIN_LANDLOCK_ABI} (Linux >= 6.12)")


def refusal(check: HostCheck) -> str:
    """Why a non-admin user's code is refused on a host that cannot confine it."""
    return (f"this deployment runs in isolated mode but cannot confine jobs here "
            f"({'; '.join(check.problems)}); only admins may run code until it can. Fix the "
            "host, or set MESHYARD_ISOLATION=trusted on a cluster where every user is trusted")
