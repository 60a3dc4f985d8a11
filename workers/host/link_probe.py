"""A host's side of the link probe (orchestrator/runtime/link_probe.py): send zeros to the
attempt controller's sink for a few seconds over TCP, from the worker actor, so the
controller measures this host's link from its own node."""

from __future__ import annotations

import socket
import time

CHUNK = 64 << 10


def send_probe(addr: str, port: int, tag: str, *, nbytes: int, seconds: float) -> int:
    """Sends `tag` then up to `nbytes` zeros to addr:port, for at most `seconds`; returns the
    bytes handed to the socket (what arrived is the sink's to count)."""
    deadline = time.monotonic() + seconds
    data = bytes(CHUNK)
    sent = 0
    with socket.create_connection((addr, port), timeout=max(0.5, seconds)) as s:
        s.sendall(tag.encode("ascii"))
        while sent < nbytes:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                sent += s.send(data[:min(CHUNK, nbytes - sent)])
            except TimeoutError:
                break
    return sent
