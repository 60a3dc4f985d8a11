"""Which end of a slow link is the slow one, measured from the control plane's node.

Asked in two cases: an attempt that failed its pre-flight check (`locate_slow_end`), and a
running gang whose steps all slowed together with no rank straggling
(`measure_slow_links`, orchestrator/watchdog/slowdown.py decides when), which stores a
`SLOW_LINK` warning naming the host and the link class and makes the host suspect.

A pre-flight check that finds a slow link between two hosts cannot tell which host's link is
bad: a p2p test blames its sender, and a 2-host gang has one link. So when an attempt fails
its pre-flight check, its controller (on the control plane's node, apart from the workers)
opens a TCP sink and every host of the gang sends it zeros for up to PROBE_S
(workers/host/link_probe.py); the sink times what arrives from each. A host whose rate is
under SLOW_RATIO of the best one's is the slow end (`slow_ends`), and the next placement
avoids it alone. When no host stands out, or all do (the control plane's own link), the
pre-flight check's culprits stand. Only connections that present the probe's random tag are
read, and a flood of other connections cannot keep them out (`_Sink`); the sink lives for one
probe.

>>> slow_ends({"10.0.0.1": 0.95, "10.0.0.2": 0.0005})
['10.0.0.2']
>>> slow_ends({"10.0.0.1": 0.95, "10.0.0.2": 0.8}), slow_ends({"10.0.0.1": 0.9, "10.0.0.2": None})
([], [])
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import ray

from orchestrator.runtime.events import Failed, SlowLink

if TYPE_CHECKING:
    from orchestrator.runtime.gang import WorkerGang

PROBE_BYTES = 16 << 20
PROBE_S = 3.0
SLOW_RATIO = 0.25
_TAG_LEN = 32
TAG_WAIT_S = 1.0  # what a connection gets to present its tag
MAX_PENDING = 256  # untagged connections held at once; past it the oldest is closed


def slow_ends(rates: Mapping[str, float | None]) -> list[str]:
    """The hosts whose rate (GB/s) is under SLOW_RATIO of the best one's; [] when fewer than
    two were measured, none stands out, or every measured one would."""
    known = {h: r for h, r in rates.items() if r is not None}
    if len(known) < 2:
        return []
    best = max(known.values())
    slow = sorted(h for h, r in known.items() if r < best * SLOW_RATIO)
    return slow if len(slow) < len(known) else []


class _Sink:
    """A TCP listener on this node's address that counts what each tagged sender delivers.

    Anyone who reaches the port may connect (a job's rank on a gang host included); none can
    keep the gang's hosts from being measured: one thread serves every connection, a
    connection gets TAG_WAIT_S to present a tag, a wrong tag or a tag already used closes it
    at once, and past MAX_PENDING untagged connections the oldest is closed for each new one.
    What a stranger sends is never counted."""

    def __init__(self, ip: str, tags: list[str], *, lifetime_s: float) -> None:
        self._tags = set(tags)
        self._lock = threading.Lock()
        self.got: dict[str, tuple[int, float, float]] = {}  # tag -> (bytes, first, last)
        self.refused = 0  # connections closed without being counted
        self._sock = socket.create_server((ip, 0), backlog=128)
        self._sock.setblocking(False)
        self.addr, self.port = ip, self._sock.getsockname()[1]
        self._end = time.monotonic() + lifetime_s
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        # untagged: socket -> (what arrived of its tag, deadline); tagged: socket -> [tag,
        # bytes, first, last]
        self._pending: dict[socket.socket, tuple[bytes, float]] = {}
        self._open: dict[socket.socket, list[Any]] = {}
        self._serving = threading.Thread(target=self._serve, name="link-probe-sink",
                                         daemon=True)
        self._serving.start()

    def _serve(self) -> None:
        try:
            while (now := time.monotonic()) < self._end:
                for key, _ in self._sel.select(timeout=0.05):
                    if key.fileobj is self._sock:
                        self._accept()
                    elif key.fileobj in self._pending:
                        self._read_tag(key.fileobj)  # type: ignore[arg-type]
                    else:
                        self._read_data(key.fileobj)  # type: ignore[arg-type]
                for conn in [c for c, (_, dl) in self._pending.items() if dl < now]:
                    self._drop(conn)
        finally:
            for conn in list(self._open):
                self._finish(conn)
            for conn in list(self._pending):
                self._drop(conn)
            self._sel.close()

    def _accept(self) -> None:
        for _ in range(64):  # what the backlog holds now, a bounded batch
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conn.setblocking(False)
            while len(self._pending) >= MAX_PENDING:
                self._drop(next(iter(self._pending)))  # the oldest
            self._pending[conn] = (b"", time.monotonic() + TAG_WAIT_S)
            self._sel.register(conn, selectors.EVENT_READ, None)

    @staticmethod
    def _recv(conn: socket.socket, n: int) -> bytes | None:
        """Up to `n` bytes; None when none are there yet; b"" at the end or on an error."""
        try:
            return conn.recv(n)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _read_tag(self, conn: socket.socket) -> None:
        got, deadline = self._pending[conn]
        part = self._recv(conn, _TAG_LEN - len(got))
        if part is None:
            return
        if not part:
            self._drop(conn)
            return
        got += part
        if len(got) < _TAG_LEN:
            self._pending[conn] = (got, deadline)
            return
        name = got.decode("ascii", "replace")
        with self._lock:
            fresh = name in self._tags and name not in self.got and \
                all(o[0] != name for o in self._open.values())
        if not fresh:
            self._drop(conn)
            return
        del self._pending[conn]
        now = time.monotonic()
        self._open[conn] = [name, 0, now, now]

    def _read_data(self, conn: socket.socket) -> None:
        entry = self._open[conn]
        data = self._recv(conn, 1 << 20)
        if data is None:
            return
        if not data:
            self._finish(conn)
            return
        entry[1] += len(data)
        entry[3] = time.monotonic()

    def _finish(self, conn: socket.socket) -> None:
        name, total, first, last = self._open.pop(conn)
        self._close(conn)
        with self._lock:
            self.got[name] = (total, first, last)

    def _drop(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        self.refused += 1
        self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        conn.close()

    def wait_counted(self, n: int, *, timeout_s: float) -> bool:
        """Until `n` senders are counted to their end (what is still in flight arrives), or
        `timeout_s` passed; whether they were."""
        deadline = time.monotonic() + timeout_s
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.got) >= n

    def rate(self, tag: str) -> float | None:
        with self._lock:
            got = self.got.get(tag)
        if got is None or got[0] == 0:
            return None
        total, first, last = got
        return total / max(last - first, 1e-3) / 1e9

    def close(self) -> None:
        self._end = 0.0
        self._serving.join(timeout=2.0)
        self._sock.close()


def probe_hosts(hosts: Mapping[str, Any], *, seconds: float = PROBE_S,
                nbytes: int = PROBE_BYTES) -> dict[str, float | None]:
    """GB/s from each host (address -> a worker actor there) to this process, measured at the
    same time; None for a host that sent nothing."""
    if not hosts:
        return {}
    tags = {ip: secrets.token_hex(_TAG_LEN // 2) for ip in hosts}
    sink = _Sink(ray.util.get_node_ip_address(), list(tags.values()),
                 lifetime_s=seconds + 3.0)
    try:
        refs = [w.send_probe.remote(sink.addr, sink.port, tags[ip], nbytes=nbytes,
                                    seconds=seconds) for ip, w in hosts.items()]
        sent, _ = ray.wait(refs, num_returns=len(refs), timeout=seconds + 3.0)
        sink.wait_counted(len(sent), timeout_s=1.0)  # the last bytes in flight
    finally:
        sink.close()
    return {ip: sink.rate(tag) for ip, tag in tags.items()}


def _measure(gang: WorkerGang) -> tuple[dict[str, float | None], dict[str, str]] | None:
    """(each host's rate from this node, host address -> node name); None for a gang on one
    host."""
    hosts = gang.host_workers()
    if len(hosts) < 2:
        return None
    names = {s.ip: str(s.node or s.ip) for s in gang.ranks.values() if s.ip}
    return probe_hosts(hosts), names


def locate_slow_end(outcome: Failed, gang: WorkerGang) -> Failed:
    """A failed pre-flight check's outcome with the slow end measured: its message gains each
    host's rate from the control plane's node, and when one end stands out the nodes it
    fails and avoids are that end's alone. A gang on one host is left as it is."""
    measured = _measure(gang)
    if measured is None:
        return outcome
    rates, names = measured
    shown = ", ".join(f"{names.get(ip, ip)} " + (f"{r:.3g} GB/s" if r is not None
                                                  else "nothing arrived")
                      for ip, r in sorted(rates.items()))
    slow = slow_ends(rates)
    text = f"{outcome.message}; each host's link measured from the control plane's node: {shown}"
    if not slow:
        return replace(outcome, message=f"{text}: no host stands out")
    nodes = tuple(sorted({names.get(ip, ip) for ip in slow}))
    return replace(outcome, message=f"{text}: the slow end is {', '.join(nodes)}",
                   failed_nodes=nodes, avoid_nodes=nodes)


def link_class(gang: WorkerGang, node: str) -> str:
    """The pre-flight check's class of a link between `node` and another of the gang's
    nodes (e.g. "gloo-tcp"), else "between hosts"."""
    for backends in gang.start.preflight_links().values():
        for links in backends.values():
            for link in links.values():
                if node in link.nodes and len(set(link.nodes)) > 1:
                    return link.link
    return "between hosts"


def measure_slow_links(gang: WorkerGang, *, slower: float) -> list[SlowLink]:
    """A running gang slowed `slower` times: each host's link measured from the control
    plane's node; one event per host that stands out as the slow end."""
    measured = _measure(gang)
    slow = slow_ends(measured[0]) if measured is not None else []
    if measured is None or not slow:
        return []
    rates, names = measured
    others = max(r for h, r in rates.items() if h not in slow and r is not None)
    return [SlowLink(node=names.get(ip, ip), host=ip, gbps=float(rates[ip] or 0.0),
                     others_gbps=others, slower=slower, link=link_class(gang, names.get(ip, ip)))
            for ip in slow]
