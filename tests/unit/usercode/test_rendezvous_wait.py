"""wait_for_store: ranks other than 0 wait for rank 0's store to listen before torch's own
connect (which, refused, backs off for 0.3-0.4 s), bounded, and rank 0 never waits."""

from __future__ import annotations

import socket
import threading
import time

from meshyard.parallel import wait_for_store
from workers.host.env import free_port


def test_rank_zero_never_waits() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    assert wait_for_store("127.0.0.1", port, rank=0, within_s=60.0)
    assert time.monotonic() - t0 < 30.0  # it did not wait out its bound


def test_gives_up_after_its_bound_when_nothing_listens() -> None:
    port = free_port()
    t0 = time.monotonic()
    assert not wait_for_store("127.0.0.1", port, rank=1, within_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 30.0  # waited its bound, not torch's timeout


def test_returns_once_the_store_listens_and_the_store_sees_an_empty_connection() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = free_port()
    seen: list[bytes] = []

    def listen_late() -> None:
        time.sleep(0.3)  # rank 0 reaches its rendezvous after rank 1
        server.bind(("127.0.0.1", port))
        server.listen(1)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            seen.append(conn.recv(16))

    t = threading.Thread(target=listen_late, daemon=True)
    t.start()
    try:
        assert wait_for_store("127.0.0.1", port, rank=1, within_s=10.0)
        t.join(10)
    finally:
        server.close()
    assert seen == [b""]  # the probe sent nothing: the store reads a plain close
