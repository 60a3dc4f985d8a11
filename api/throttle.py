"""Failed logins per client address: a bad bearer token on the API, a bad token on the
dashboard's login form. After `max_failures` within `window_s` from one address, that address
gets 429 with Retry-After until its oldest counted failure leaves the window.

The address is the request's client after the proxy headers (api/app.py applies
X-Forwarded-For from MESHYARD_TRUSTED_PROXIES only), so one client behind a trusted proxy
never throttles the others. A success neither counts nor resets the count (a user holding one
valid token could otherwise reset it between guesses at others). Memory is bounded: at most
`max_clients` addresses, least recently failed dropped first, `max_failures` timestamps each.
Used from the event loop only.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from starlette.requests import HTTPConnection

UNKNOWN_CLIENT = "unknown"


def client_address(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client is not None else UNKNOWN_CLIENT


class FailedLogins:
    """>>> f = FailedLogins(max_failures=2, window_s=60, max_clients=10, clock=lambda: 0.0)
    >>> f.failed("10.0.0.1"); f.failed("10.0.0.1"); f.retry_after("10.0.0.1")
    60
    """

    def __init__(self, *, max_failures: int, window_s: float, max_clients: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window_s, self.max_clients = max_failures, window_s, max_clients
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until `client` may try a token again, or None when it may now."""
        times = self._failures.get(client)
        if times is None or len(times) < self.max_failures:
            return None
        wait = times[0] + self.window_s - self._clock()
        if wait <= 0:
            return None
        return max(1, math.ceil(wait))

    def failed(self, client: str) -> None:
        now = self._clock()
        times = self._failures.get(client)
        if times is None:
            times = self._failures[client] = deque(maxlen=self.max_failures)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        times.append(now)
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
