"""The link probe's sink and verdict (orchestrator/runtime/link_probe.py) over real TCP on
127.0.0.1: a sender that trickles its bytes (what a 4 Mbit/s link delivers) measures far
below one that sends freely and is named the slow end; a connection without the probe's tag
is read no further and measured not at all. When a running gang's steps slow together
(orchestrator/watchdog/slowdown.py), and how the slow end is stored (a SLOW_LINK warning, the
node suspect). On a real multi-host cluster: bench/chaos.py's slow_link kind."""

from __future__ import annotations

import contextlib
import doctest
import socket
import threading
import time
from pathlib import Path

from orchestrator.runtime.events import SlowLink
from orchestrator.runtime.link_probe import _Sink, slow_ends
from orchestrator.store import open_store
from orchestrator.watchdog.slowdown import SlowdownWatch
from tests.support.jobs import apply_controller_event, submit
from workers.host.link_probe import send_probe


def _trickle(port: int, tag: str, *, seconds: float) -> None:
    """0.5 MB/s: 16 KiB every 32 ms."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(tag.encode())
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.sendall(bytes(16 << 10))
            time.sleep(0.032)


def test_the_trickling_sender_is_the_slow_end_and_a_stranger_is_ignored() -> None:
    fast, slow = "f" * 32, "s" * 32
    sink = _Sink("127.0.0.1", [fast, slow], lifetime_s=30.0)
    try:
        stranger = socket.create_connection(("127.0.0.1", sink.port))
        # the sink may read the wrong tag and close the connection before the send ends (reset)
        with contextlib.suppress(OSError):
            stranger.sendall(b"x" * 32 + bytes(1 << 20))
        t = threading.Thread(target=_trickle, args=(sink.port, slow), kwargs={"seconds": 1.5})
        t.start()
        sent = send_probe("127.0.0.1", sink.port, fast, nbytes=32 << 20, seconds=1.5)
        t.join()
        assert sink.wait_counted(2, timeout_s=30.0)
    finally:
        sink.close()
        stranger.close()
    assert sent == 32 << 20  # loopback takes 32 MiB well within 1.5 s
    rates = {"fast-host": sink.rate(fast), "slow-host": sink.rate(slow)}
    assert rates["fast-host"] is not None and rates["slow-host"] is not None
    assert 0.0002 < rates["slow-host"] < 0.002, rates  # about 0.0005 GB/s
    assert rates["fast-host"] > 50 * rates["slow-host"], rates
    assert slow_ends(rates) == ["slow-host"]
    assert sink.rate("x" * 32) is None and len(sink.got) == 2
    assert sink.refused == 1  # the stranger's connection, closed uncounted


def test_a_flood_of_strangers_does_not_keep_the_hosts_from_being_measured() -> None:
    """A hostile process that reaches the sink's port (a rank on a gang host) opens more
    silent connections than the sink holds, sends wrong tags, and replays a real host's tag
    on a second connection with a flood of its own bytes: every host is still measured, and
    only by its own connection."""
    from orchestrator.runtime.link_probe import MAX_PENDING

    a, b = "a" * 32, "b" * 32
    sink = _Sink("127.0.0.1", [a, b], lifetime_s=60.0)
    strangers: list[socket.socket] = []
    try:
        for _ in range(MAX_PENDING + 100):  # silent: they never send a tag
            strangers.append(socket.create_connection(("127.0.0.1", sink.port)))
        for i in range(50):  # wrong tags, then data
            s = socket.create_connection(("127.0.0.1", sink.port))
            s.sendall(f"{i:032d}".encode() + bytes(64 << 10))
            strangers.append(s)
        sent = {t: send_probe("127.0.0.1", sink.port, t, nbytes=4 << 20, seconds=1.0)
                for t in (a, b)}
        replay = socket.create_connection(("127.0.0.1", sink.port))
        strangers.append(replay)
        replay.sendall(a.encode())
        try:
            for _ in range(64):
                replay.sendall(bytes(1 << 20))
        except OSError:
            pass  # closed by the sink: the tag was used
        assert sink.wait_counted(2, timeout_s=30.0)
    finally:
        sink.close()
        for s in strangers:
            s.close()
    assert sent == {a: 4 << 20, b: 4 << 20}
    assert sink.got[a][0] == 4 << 20 and sink.got[b][0] == 4 << 20, sink.got
    assert sink.rate(a) is not None and sink.rate(b) is not None
    assert sink.refused >= 150, sink.refused


def test_no_end_stands_out_when_both_or_neither_are_slow() -> None:
    assert slow_ends({"a": 0.9, "b": 0.5}) == []
    assert slow_ends({"a": 0.9, "b": 0.2, "c": 0.1}) == ["b", "c"]
    assert slow_ends({"a": None, "b": 0.1}) == []
    assert slow_ends({"a": 0.0, "b": 0.0}) == []


def test_docstring_examples() -> None:
    from orchestrator.runtime import link_probe
    from orchestrator.watchdog import slowdown

    for module in (link_probe, slowdown):
        assert doctest.testmod(module).failed == 0


def test_a_gang_that_slows_together_is_due_once_a_minute_at_most_three_times() -> None:
    w = SlowdownWatch(warmup=10, baseline_n=20, recent_n=20)
    w.observe([0.5] * 10 + [0.02] * 20)  # warm-up steps do not count
    assert w.baseline_s == 0.02
    w.observe([0.04] * 20)
    assert w.due(now_s=1.0) is None  # 2x: under the ratio
    w.observe([0.3] * 20)
    assert w.due(now_s=2.0) == 15.0
    assert w.due(now_s=30.0) is None and w.due(now_s=62.0) == 15.0
    assert w.due(now_s=122.0) == 15.0 and w.due(now_s=999.0) is None  # three checks
    # a few slow steps (a checkpoint save) among fast ones: the median stays put
    v = SlowdownWatch(warmup=0, baseline_n=5, recent_n=5)
    v.observe([0.02] * 5 + [0.02, 2.0, 0.02, 0.02, 3.0])
    assert v.due(now_s=0.0) is None


def test_a_slow_link_is_stored_as_a_warning_and_makes_its_node_suspect(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        job_id = submit(store, {"name": "slow"})
        apply_controller_event(store, job_id, SlowLink(
            node="myl-h2", host="198.18.0.12", gbps=0.00051, others_gbps=0.93, slower=14.2,
            link="gloo-tcp"))
        (ev,) = [e for e in store.list_events(job_id) if e.reason == "SLOW_LINK"]
        assert ev.kind == "warning"
        assert ev.message.startswith("steps take 14.2x as long as this attempt's first ones "
                                     "and no rank straggles: the link of myl-h2 (198.18.0.12) "
                                     "is the slow end, 0.00051 GB/s"), ev.message
        assert "other hosts gave 0.93 GB/s (gloo-tcp)" in ev.message
        assert ev.data["node"] == "myl-h2" and ev.data["attempt"] == 1
        health = {h.node: h for h in store.list_node_health()}
        assert health["myl-h2"].state == "suspect", health
    finally:
        store.close()
