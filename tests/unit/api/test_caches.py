"""The authenticated-token cache."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from api.auth import TokenCache
from orchestrator.access import Role
from orchestrator.store.records import UserRecord

ALICE = UserRecord(id=1, name="alice", role=Role.USER, created_at=datetime.now(UTC))
BOB = UserRecord(id=2, name="bob", role=Role.USER, created_at=datetime.now(UTC))


def test_token_cache_hits_until_expiry() -> None:
    cache = TokenCache(ttl_s=0.05)
    assert cache.get("t1") is None
    cache.put("t1", ALICE)
    assert cache.get("t1") == ALICE and cache.get("t2") is None
    time.sleep(0.06)
    assert cache.get("t1") is None


def test_token_cache_evicts_least_recently_used() -> None:
    cache = TokenCache(ttl_s=60, max_entries=2)
    cache.put("a", ALICE)
    cache.put("b", BOB)
    assert cache.get("a") == ALICE  # "b" is now the least recently used
    cache.put("c", ALICE)
    assert cache.get("b") is None and cache.get("a") == ALICE and cache.get("c") == ALICE
