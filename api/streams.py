"""Long-lived responses: at most N open per user, each re-checking its caller's credential.

`StreamSlots.acquire` is called by the route before it answers (so a caller over the limit
gets a 429, not a stream that ends at once); the slot is released when the response has been
sent or abandoned — `SlotStreamingResponse` releases it in `__call__`, which Starlette always
runs for a returned response, whether the body finished, the client left, or the body never
started.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import TooManyRequests


class StreamSlots:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[int, int] = {}
        self._lock = threading.Lock()

    def open_for(self, user_id: int) -> int:
        with self._lock:
            return self._open.get(user_id, 0)

    def acquire(self, user_id: int, user_name: str) -> Callable[[], None]:
        """Returns the release function (idempotent), or raises TooManyRequests."""
        with self._lock:
            held = self._open.get(user_id, 0)
            if held >= self.limit:
                raise TooManyRequests(
                    f"{user_name} already follows {held} streams, the most one user may "
                    f"(max_streams_per_user={self.limit}); close one, or ask an operator "
                    "to raise MESHYARD_MAX_STREAMS_PER_USER",
                    quota="max_streams_per_user", limit=self.limit)
            self._open[user_id] = held + 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._open.get(user_id, 1) - 1
                if left > 0:
                    self._open[user_id] = left
                else:
                    self._open.pop(user_id, None)

        return release


class SlotStreamingResponse(StreamingResponse):
    def __init__(self, content: AsyncIterator[bytes], *, release: Callable[[], None],
                 media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
