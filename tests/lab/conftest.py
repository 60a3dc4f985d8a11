"""The lab fixture: a real multi-host Ray cluster on this machine (deploy/lab/lab.py), hosts as
network namespaces on the 198.18.0.0/24 test range (two Ray hosts, head and worker, and one
host without Ray for a control plane), brought up once for a module and removed
afterwards, also when a test or the bring-up fails.

Skips, with the reason, where the lab cannot be built (not root, no `ip netns`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.lab import lab as labmod


@pytest.fixture(scope="module")
def lab() -> Iterator[labmod.Lab]:
    why = labmod.lab_available()
    if why:
        pytest.skip(f"lab unavailable: {why}")
    built = labmod.up(2, plain=1)  # removes what it made when it fails
    try:
        yield built
    finally:
        left = labmod.down()
        assert not left, f"lab down left behind: {left}"
