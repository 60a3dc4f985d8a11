"""The authenticated-token cache."""

from __future__ import annotations

from datetime import UTC, datetime

from api.auth import TokenCache
from orchestrator.admission.access import Role
from orchestrator.store.records import UserRecord

ALICE = UserRecord(id=1, name="alice", role=Role.USER, created_at=datetime.now(UTC))
BOB = UserRecord(id=2, name="bob", role=Role.USER, created_at=datetime.now(UTC))


def test_token_cache_hits_until_expiry() -> None:
    now = [100.0]
    cache = TokenCache(ttl_s=5, clock=lambda: now[0])
    assert cache.get("t1") is None
    cache.put("t1", ALICE)
    assert cache.get("t1") == ALICE and cache.get("t2") is None
    now[0] += 5
    assert cache.get("t1") == ALICE  # at its expiry: still valid
    now[0] += 0.01
    assert cache.get("t1") is None


def test_token_cache_evicts_least_recently_used() -> None:
    cache = TokenCache(ttl_s=60, max_entries=2)
    cache.put("a", ALICE)
    cache.put("b", BOB)
    assert cache.get("a") == ALICE  # "b" is now the least recently used
    cache.put("c", ALICE)
    assert cache.get("b") is None and cache.get("a") == ALICE and cache.get("c") == ALICE


def test_forgetting_a_token_forgets_the_sessions_it_opened() -> None:
    cache = TokenCache(ttl_s=60)
    cache.put("tok-a", ALICE)
    digest = TokenCache._key("tok-a")
    cache.put("session:s1", ALICE, opened_by=digest)
    cache.put("session:s2", ALICE, opened_by=TokenCache._key("tok-b"))
    cache.forget_digest(digest)
    assert cache.get("tok-a") is None and cache.get("session:s1") is None
    assert cache.get("session:s2") == ALICE
