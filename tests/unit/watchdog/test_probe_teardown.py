"""The probe's side thread and the rank's process-group teardown never overlap: while
`destroy_process_group` runs, the probe makes no Flight Recorder call (a dump racing the
destruction of the groups it reads is a lock-order hazard between the recorder and the GIL),
and it samples again only once the call returned. Real gloo, one rank, in this process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from meshyard import _probe


def test_no_flight_recorder_call_while_the_process_group_is_destroyed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c_ext = torch._C._distributed_c10d
    real_dump = c_ext._dump_fr_trace
    calls: list[tuple[float, float]] = []  # each dump's start and end

    def dump(*args: object) -> bytes:
        t0 = time.monotonic()
        try:
            return real_dump(*args)
        finally:
            calls.append((t0, time.monotonic()))

    monkeypatch.setattr(c_ext, "_dump_fr_trace", dump)

    real_destroy = distributed_c10d.destroy_process_group
    window: list[tuple[float, float]] = []

    def slow_destroy(*args: object, **kwargs: object) -> None:
        """The real teardown, 0.5 s after it is entered: a window ten probe wakes long in
        which the default group still exists."""
        t0 = time.monotonic()
        time.sleep(0.5)
        try:
            real_destroy(*args, **kwargs)
        finally:
            window.append((t0, time.monotonic()))

    monkeypatch.setattr(distributed_c10d, "destroy_process_group", slow_destroy)
    monkeypatch.setattr(dist, "destroy_process_group", slow_destroy)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    probe = _probe.Probe(tmp_path, rank=0, interval_s=0.05).start()
    try:
        deadline = time.monotonic() + 30
        while not calls:  # the probe samples the live group
            assert time.monotonic() < deadline, "the probe never sampled the process group"
            time.sleep(0.02)
        dist.all_reduce(torch.ones(1))
        assert dist.destroy_process_group is not slow_destroy  # the user's name is guarded
        dist.destroy_process_group()
        sampled = len(calls)
        time.sleep(0.3)  # six more wakes: none may call into a destroyed group either
    finally:
        probe.stop()
        probe.thread.join(10)
        if dist.is_initialized():
            real_destroy()
    (start, end), = window
    assert calls[0][1] < start
    overlapping = [c for c in calls if c[0] < end and c[1] > start]
    assert not overlapping, (start, end, overlapping)
    assert len(calls) == sampled


def test_destroyed_groups_are_kept_until_the_next_destroy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guarded `destroy_process_group` keeps the groups it destroys, so the user's
    objects that still hold one (a DDP Reducer freed after the call) never drop the last
    reference with the GIL held; the next destroy call lets the earlier ones go."""
    for mod in (distributed_c10d, dist):  # the guard's wrapper is undone after the test
        monkeypatch.setattr(mod, "destroy_process_group", distributed_c10d.destroy_process_group)
    monkeypatch.setattr(_probe, "_KEPT_GROUPS", [])
    assert _probe.guard_teardown()
    rounds = []  # each round's groups, held here so that identities stay unique
    try:
        for _ in range(2):
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            sub = dist.new_group([0])
            rounds.append((distributed_c10d._get_default_group(), sub))
            dist.destroy_process_group()
            assert not dist.is_initialized()
            kept = _probe._KEPT_GROUPS
            assert len(kept) == 2 and all(any(g is k for k in kept) for g in rounds[-1])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # the first round's groups were let go by the second call
    assert not any(g is k for g in rounds[0] for k in _probe._KEPT_GROUPS)
