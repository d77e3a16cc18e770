"""The Redis circuit breaker: opens on a failing window, shared by every instance, half-open
probes one call at a time, closes on success (real Redis, own key prefix)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.faults.breaker import BreakerConfig, BreakerState, RedisBreaker

FAST = BreakerConfig(window_s=5, min_calls=4, failure_ratio=0.5, open_s=0.3, probe_timeout_s=2)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_url)
    yield r
    await r.aclose()


async def test_flapping_opens_the_breaker_for_every_instance(
    client: aioredis.Redis, key_prefix: str
) -> None:
    seen: list[tuple[str, BreakerState]] = []
    one = RedisBreaker(client, key_prefix, FAST, on_state=lambda d, s: seen.append((d, s)))
    other = RedisBreaker(client, key_prefix, FAST)  # another gateway process
    for ok in (False, True, False, True):  # fails every other call
        assert await one.allow("d") and await other.allow("d")
        await one.record("d", ok=ok)
    assert await one.state("d") is BreakerState.CLOSED  # 2 of 4 failed, but on a success
    assert await one.record("d", ok=False) is BreakerState.OPEN  # 3 of 5
    assert not await other.allow("d")
    assert await other.unavailable(["d", "e"]) == frozenset({"d"})
    assert ("d", BreakerState.OPEN) in seen


async def test_half_open_lets_one_probe_through_and_closes_on_success(
    client: aioredis.Redis, key_prefix: str
) -> None:
    breaker = RedisBreaker(client, key_prefix, FAST)
    for _ in range(4):
        await breaker.record("d", ok=False)
    assert await breaker.state("d") is BreakerState.OPEN
    await asyncio.sleep(FAST.open_s + 0.1)
    assert await breaker.state("d") is BreakerState.HALF_OPEN
    assert await breaker.unavailable(["d"]) == frozenset()  # requests may reach it to probe
    assert await breaker.allow("d")  # the probe
    assert not await breaker.allow("d")  # everyone else waits for it
    assert await breaker.record("d", ok=True) is BreakerState.CLOSED
    assert await breaker.allow("d") and await breaker.allow("d")


async def test_a_failed_probe_opens_it_again(client: aioredis.Redis, key_prefix: str) -> None:
    breaker = RedisBreaker(client, key_prefix, FAST)
    for _ in range(4):
        await breaker.record("d", ok=False)
    await asyncio.sleep(FAST.open_s + 0.1)
    assert await breaker.allow("d")
    assert await breaker.record("d", ok=False) is BreakerState.OPEN
    assert not await breaker.allow("d")


async def test_redis_down_lets_calls_through() -> None:
    dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    breaker = RedisBreaker(dead, "x", FAST)
    assert await breaker.allow("d")
    assert await breaker.record("d", ok=False) is BreakerState.CLOSED
    assert await breaker.unavailable(["d"]) == frozenset()
    await dead.aclose()
