"""Keeping the control plane's secrets out of what other processes can read about it.

Linux shows a process's environment and command line to its user in /proc/<pid>/environ and
/proc/<pid>/cmdline — the memory the process started with, whatever it changed since — and
Ray copies the driver's command line into its job table, which every worker can read. So a
database URL given as `--database-url` or `MESHYARD_DATABASE_URL`, or a seeded
`MESHYARD_ADMIN_TOKEN`, would be readable by a job. `hide_secrets()`:

* overwrites those values in place in the process's own start-up memory (the region the kernel
  reports in /proc/self/stat as arg_start..env_end), the way setproctitle rewrites argv; the
  settings already hold them, and os.environ / sys.argv are separate Python copies;
* marks the process non-dumpable (prctl PR_SET_DUMPABLE 0): its /proc files (environ, mem,
  fd links, cwd) then belong to root, so other processes of the same non-root user cannot open
  them.

Linux only; elsewhere it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from pathlib import Path

_PR_SET_DUMPABLE = 4
SECRET_FLAGS = ("--database-url", "--admin-token")
SECRET_ENV = ("MESHYARD_DATABASE_URL", "MESHYARD_ADMIN_TOKEN")
MASK = ord("*")


def _regions() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """((arg_start, arg_end), (env_start, env_end)) from /proc/self/stat (fields 48-51)."""
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # fields from the 3rd on (comm may hold ' ')
    if len(fields) < 49:
        return None
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    return (arg_start, arg_end), (env_start, env_end)


def _mask_values(start: int, end: int, secret_at: Iterable[int]) -> int:
    """Overwrites the NUL-separated strings whose index is in `secret_at`; returns how many."""
    if end <= start:
        return 0
    raw = ctypes.string_at(start, end - start)
    wanted, masked, offset = set(secret_at), 0, 0
    for index, item in enumerate(raw.split(b"\0")):
        if index in wanted and item:
            ctypes.memset(start + offset, MASK, len(item))
            masked += 1
        offset += len(item) + 1
    return masked


def _env_positions(raw: bytes, names: Iterable[str]) -> list[int]:
    prefixes = tuple(f"{n}=".encode() for n in names)
    return [i for i, item in enumerate(raw.split(b"\0")) if item.startswith(prefixes)]


def hide_secrets(*, values: Iterable[str | None] = ()) -> str:
    """Masks the secrets in this process's start-up memory and makes it non-dumpable.
    `values`: secret strings to mask wherever they appear as a whole argument too."""
    if not sys.platform.startswith("linux"):
        return "not Linux: /proc hiding skipped"
    regions = _regions()
    if regions is None:
        return "no /proc/self/stat: /proc hiding skipped"
    (a0, a1), (e0, e1) = regions
    args = ctypes.string_at(a0, a1 - a0).split(b"\0") if a1 > a0 else []
    plain = {v.encode() for v in values if v}
    flagged = [i + 1 for i, a in enumerate(args) if a.decode(errors="replace") in SECRET_FLAGS]
    flagged += [i for i, a in enumerate(args)  # --database-url=URL, or a secret itself
                if (b"=" in a and a.split(b"=", 1)[0].decode(errors="replace") in SECRET_FLAGS)
                or a in plain]
    n_args = _mask_values(a0, a1, flagged)
    env_raw = ctypes.string_at(e0, e1 - e0) if e1 > e0 else b""
    n_env = _mask_values(e0, e1, _env_positions(env_raw, SECRET_ENV))
    libc = ctypes.CDLL(None, use_errno=True)
    dumpable = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    return (f"masked {n_args} argument(s) and {n_env} environment entr(y/ies); "
            f"{'non-dumpable' if dumpable else 'prctl(PR_SET_DUMPABLE) failed'}")
