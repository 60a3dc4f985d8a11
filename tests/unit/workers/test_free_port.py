"""free_port: a rendezvous port drawn below the kernel's ephemeral range, so nothing the
kernel hands out between its choice and rank 0's bind can take it."""

from __future__ import annotations

import random
import socket

import pytest

import workers.host.env as env
from workers.host.env import free_port


def _bind(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    return s


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    start = env._ephemeral_start()
    ports = [free_port() for _ in range(20)]
    assert all(20000 <= p < start for p in ports), (start, ports)
    assert len(set(ports)) > 1  # drawn at random, not one fixed port
    for p in ports[:5]:
        _bind(p).close()  # free when returned


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    held = _bind(0)
    held.listen()
    taken = held.getsockname()[1]
    probe = _bind(0)
    free = probe.getsockname()[1]
    probe.close()
    monkeypatch.setattr(env, "_PORTS_FROM", 1024)
    monkeypatch.setattr(env, "_ephemeral_start", lambda: 65536)
    monkeypatch.setattr(random, "sample", lambda _range, _k: [taken, free])
    try:
        assert free_port() == free
    finally:
        held.close()


def test_no_room_below_the_ephemeral_range_lets_the_kernel_pick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "_ephemeral_start", lambda: 20500)
    port = free_port()
    assert not 20000 <= port < 20500
    _bind(port).close()
