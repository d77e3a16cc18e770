"""Rule versions in SQL and hot reload between two registries on the same Redis and database,
on SQLite and on PostgreSQL (``store_url``, tests/gateway/conftest.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.queue.client.connection import redis_client
from gateway.rules.registry import RuleRegistry
from gateway.rules.setup import changes_channel
from gateway.rules.sticky import StickyConversations, conversation_key
from gateway.rules.store import GLOBAL, SqlRuleStore
from router.catalog import Catalog, DeploymentSpec, Tier
from router.rules import RulesInvalid

CATALOG = Catalog(
    (
        DeploymentSpec("small-a", Tier.SMALL, 8192),
        DeploymentSpec("large-a", Tier.LARGE, 8192),
    )
)
V1 = "rules:\n  - id: one\n    then: {tier: large}\n"
V2 = "rules:\n  - id: two\n    when: {app: x}\n    then: {tier: small}\n"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = redis_client(redis_url)
    yield client
    await client.aclose()


async def _registry(
    url: str, redis: aioredis.Redis, prefix: str, poll_s: float = 0.5
) -> RuleRegistry:
    store = await SqlRuleStore.connect(url)
    registry = RuleRegistry(
        store, redis, channel=changes_channel(prefix), catalog=CATALOG, poll_interval_s=poll_s
    )
    await registry.start()
    return registry


async def _close(*registries: RuleRegistry) -> None:
    for registry in registries:
        await registry.aclose()
        await registry.store.aclose()


async def test_versions_author_diff_and_rollback(store_url: str) -> None:
    store = await SqlRuleStore.connect(store_url)
    try:
        v1 = await store.append("acme", V1, author="rules-acme", action="put")
        v2 = await store.append("acme", V2, author="admin", action="put")
        assert (v1.version, v2.version) == (1, 2)
        assert "-    then: {tier: large}" in v2.diff and "+    when: {app: x}" in v2.diff
        gone = await store.append("acme", None, author="admin", action="delete")
        assert gone.source is None and gone.version == 3
        history = await store.history("acme")
        assert [(v.version, v.author, v.action) for v in history] == [
            (1, "rules-acme", "put"),
            (2, "admin", "put"),
            (3, "admin", "delete"),
        ]
        assert history[0].created_at.tzinfo is not None
        assert await store.heads() == {"acme": 3}
        assert (await store.get("acme", 1)).source == V1  # type: ignore[union-attr]
    finally:
        await store.aclose()


async def test_concurrent_writers_get_distinct_versions(store_url: str) -> None:
    store = await SqlRuleStore.connect(store_url)
    try:
        written = await asyncio.gather(
            *(store.append("acme", f"# {i}\n", author="a", action="put") for i in range(8))
        )
        assert sorted(v.version for v in written) == list(range(1, 9))
    finally:
        await store.aclose()


async def test_change_reaches_a_second_registry_within_a_second(
    store_url: str, redis: aioredis.Redis, key_prefix: str
) -> None:
    writer = await _registry(store_url, redis, key_prefix)
    reader = await _registry(store_url, redis, key_prefix, poll_s=30)  # pub/sub path only
    try:
        started = time.monotonic()
        await writer.apply("acme", V1, author="rules-acme")
        while reader.version("acme") != 1:
            assert time.monotonic() - started < 1.0, "not propagated within a second"
            await asyncio.sleep(0.005)
        assert [r.id for r in reader.for_tenant("acme").rules] == ["one"]
    finally:
        await _close(writer, reader)


async def test_missed_message_is_caught_by_the_version_check(
    store_url: str, redis: aioredis.Redis, key_prefix: str
) -> None:
    reader = await _registry(store_url, redis, key_prefix, poll_s=0.2)
    store = await SqlRuleStore.connect(store_url)
    try:
        await store.append("acme", V2, author="cli", action="put")  # no message published
        started = time.monotonic()
        while reader.version("acme") != 1:
            assert time.monotonic() - started < 2.0
            await asyncio.sleep(0.02)
        assert [r.id for r in reader.for_tenant("acme").rules] == ["two"]
    finally:
        await store.aclose()
        await _close(reader)


async def test_invalid_rules_are_refused_and_the_running_ones_stay(
    store_url: str, redis: aioredis.Redis, key_prefix: str
) -> None:
    registry = await _registry(store_url, redis, key_prefix)
    try:
        await registry.apply("acme", V1, author="a")
        with pytest.raises(RulesInvalid, match="line 3"):
            await registry.apply("acme", "rules:\n  - id: x\n    then: {deployment: nope}\n",
                                 author="a")  # fmt: skip
        assert registry.version("acme") == 1
        assert [r.id for r in registry.for_tenant("acme").rules] == ["one"]
        assert len(await registry.store.history("acme")) == 1
    finally:
        await _close(registry)


async def test_rollback_restores_exactly_and_global_rules_follow(
    store_url: str, redis: aioredis.Redis, key_prefix: str
) -> None:
    registry = await _registry(store_url, redis, key_prefix)
    try:
        await registry.apply("acme", V1, author="a")
        await registry.apply("acme", V2, author="a")
        await registry.apply(GLOBAL, "rules:\n  - id: base\n    then: {max_tokens: 5}\n",
                             author="admin")  # fmt: skip
        restored = await registry.rollback("acme", 1, author="b")
        assert restored is not None
        assert (restored.version, restored.source, restored.restored) == (3, V1, 1)
        rules = registry.for_tenant("acme").rules
        assert [(r.id, r.scope) for r in rules] == [("one", "tenant"), ("base", "global")]
        assert [r.id for r in registry.for_tenant("globex").rules] == ["base"]
        assert await registry.rollback("acme", 99, author="b") is None
    finally:
        await _close(registry)


async def test_sticky_conversations(redis: aioredis.Redis, key_prefix: str) -> None:
    sticky = StickyConversations(redis, key_prefix, ttl_s=60)
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    key = conversation_key(None, first)
    assert key is not None and key == conversation_key(None, later)
    assert conversation_key("c-1", first) != key
    assert await sticky.tier("acme", key) is None
    await sticky.hold("acme", key, Tier.LARGE)
    assert await sticky.tier("acme", key) is Tier.LARGE
    assert await sticky.tier("globex", key) is None
    assert 0 < await redis.ttl(f"{key_prefix}:rules:sticky:acme:{key}") <= 60
