"""Failed logins per client address: a sliding window, per address, LRU-bounded."""

from __future__ import annotations

from api.throttle import FailedLogins


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_throttled_until_its_window_passes() -> None:
    clock = Clock()
    f = FailedLogins(max_failures=3, window_s=60, max_clients=100, clock=clock)
    for _ in range(2):
        f.failed("10.0.0.1")
        assert f.retry_after("10.0.0.1") is None
    clock.now += 10
    f.failed("10.0.0.1")
    assert f.retry_after("10.0.0.1") == 50  # the first failure leaves the window in 50 s
    assert f.retry_after("10.0.0.2") is None  # other addresses are not affected
    clock.now += 49.5
    assert f.retry_after("10.0.0.1") == 1
    clock.now += 0.5
    assert f.retry_after("10.0.0.1") is None
    f.failed("10.0.0.1")  # with the one at +10 s: two in the window
    assert f.retry_after("10.0.0.1") is None
    f.failed("10.0.0.1")
    assert f.retry_after("10.0.0.1") == 10


def test_memory_is_bounded_by_the_least_recently_failed() -> None:
    clock = Clock()
    f = FailedLogins(max_failures=2, window_s=60, max_clients=3, clock=clock)
    for i in range(1000):
        f.failed(f"10.0.{i // 256}.{i % 256}")
        f.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(f._failures) == 3
    assert all(len(times) <= 2 for times in f._failures.values())
    assert f.retry_after("10.0.3.231") == 60  # the newest are kept
    assert f.retry_after("10.0.0.0") is None  # the oldest forgotten
