"""What a running app holds for its routes: one typed `AppState` on `app.state.meshyard`,
read through the dependencies in api/deps.py (routes never reach into `app.state`).

`RuntimeHooks` is all the API asks of an in-process runtime (`meshyard serve` builds one; an
API-only server has none): wake the scheduler, say whether non-admins' code is refused on this
host, the warm pool's status, and the host's isolation check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from api.admission import ClusterShape
    from api.auth import TokenCache
    from api.metrics import HttpMetrics
    from api.streams import StreamSlots
    from api.throttle import FailedLogins
    from orchestrator.isolation.modes import HostCheck
    from orchestrator.settings import Settings
    from orchestrator.store.repo import Store


class RuntimeHooks(Protocol):
    isolation: HostCheck | None

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def poke(self) -> None:
        """Run the scheduler and poller passes now rather than at their next tick."""

    def code_refusal(self) -> str | None:
        """Why non-admins' code is refused on this host now, or None."""

    def pool_status(self) -> dict[str, Any] | None:
        """The warm pool's size and per-node actors, or None without a pool."""


@dataclass(frozen=True)
class AppState:
    settings: Settings
    store: Store
    engine: Engine
    http_metrics: HttpMetrics
    runtime: RuntimeHooks | None
    token_cache: TokenCache
    login_throttle: FailedLogins
    cluster_shape: ClusterShape
    stream_slots: StreamSlots
