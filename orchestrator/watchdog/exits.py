"""Why a rank ended: of its own fault, or because a peer it talked to was gone. Pure module.

When one rank of a gloo / NCCL job dies, its peers fail of it within a second: their next
collective raises "Connection closed by peer", times out waiting for the dead rank, or finds
its communicator aborted. Those errors are fallout; the cause is the rank that ended of its
own exception, signal or OOM kill. The texts below are the ones torch, gloo and NCCL print.

>>> peer_lost("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
...           "Connection closed by peer [127.0.0.1]:42119")
True
>>> peer_lost("ValueError: corrupt record in shard-00017.bin at step 3")
False
"""

from __future__ import annotations

import re

PEER_LOST = re.compile(
    r"connection (?:closed|reset) by (?:remote )?peer"
    r"|broken pipe"
    r"|remote (?:process|worker) (?:exited|crashed)"
    r"|timed out waiting \d+ ?ms for (?:recv|send) operation"
    r"|failed to pass monitoredbarrier"
    r"|failed on peer rank \d+"
    r"|communicator was aborted"
    r"|ncclremoteerror"
    r"|watchdog caught collective operation timeout",
    re.IGNORECASE)


def peer_lost(text: str | None) -> bool:
    """True when a rank's error (message, or the abort text of its signal) says a peer went
    away or stopped answering, rather than that the rank itself failed."""
    return bool(text) and PEER_LOST.search(text or "") is not None


def first_line(text: str | None, limit: int = 500) -> str:
    """The first non-empty line of `text`; past `limit` characters it ends at its last
    sentence that fits, else at `limit` with an ellipsis.

    >>> first_line("Connection closed by peer [::1]:42. This is typically caused by ...", 50)
    'Connection closed by peer [::1]:42.'
    """
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    if len(line) <= limit:
        return line
    cut = line[:limit]
    end = cut.rfind(". ")
    return cut[:end + 1] if end >= limit // 2 else cut.rstrip() + "…"
