"""The Redis circuit breaker: opens on a failing window, shared by every instance, half-open
probes one call at a time, closes on success (real Redis, own key prefix)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.faults.breaker import BreakerConfig, BreakerState, RedisBreaker
from tests.support import RedisServer

FAST = BreakerConfig(
    window_s=5, min_calls=4, failure_ratio=0.5, open_s=0.3, probe_timeout_s=2, closed_view_s=0
)
"""Every check asks Redis (the local view of a closed breaker has its own test)."""


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


async def test_a_local_view_of_a_closed_breaker_saves_round_trips_and_loses_no_count(
    client: aioredis.Redis, key_prefix: str
) -> None:
    view = BreakerConfig(
        window_s=5, min_calls=4, failure_ratio=0.5, open_s=5, probe_timeout_s=2, closed_view_s=0.3
    )
    here = RedisBreaker(client, key_prefix, view)
    elsewhere = RedisBreaker(client, key_prefix, view)
    window = f"{key_prefix}:{{breaker:d}}:window"
    assert await here.allow("d")
    for _ in range(3):
        assert await here.allow("d")  # from the local view
        assert await here.record("d", ok=True) is BreakerState.CLOSED
    assert await client.hget(window, "total") is None  # nothing sent yet
    # A failure goes to Redis at once, with the successes counted meanwhile: 1 of 4 failed.
    assert await here.record("d", ok=False) is BreakerState.CLOSED
    assert await client.hmget(window, ["total", "failures"]) == [b"4", b"1"]
    # Another process opens it; this one sees that once its view (renewed by a check) expires.
    assert await here.allow("d")
    await elsewhere.trip("d")
    assert await here.allow("d")  # still the local view
    await asyncio.sleep(0.35)
    assert not await here.allow("d")


VIEW = BreakerConfig(
    window_s=5, min_calls=4, failure_ratio=0.5, open_s=5, probe_timeout_s=2, closed_view_s=0.3
)


async def test_refresh_renews_the_closed_view_and_sends_the_counted_successes(
    client: aioredis.Redis, key_prefix: str
) -> None:
    here = RedisBreaker(client, key_prefix, VIEW)
    elsewhere = RedisBreaker(client, key_prefix, VIEW)
    window = f"{key_prefix}:{{breaker:d}}:window"
    assert await here.refresh(["d", "e"]) == {"d": BreakerState.CLOSED, "e": BreakerState.CLOSED}
    for _ in range(3):
        assert await here.record("d", ok=True) is BreakerState.CLOSED  # counted locally
    assert await client.hget(window, "total") is None
    await here.refresh(["d"])
    assert await client.hget(window, "total") == b"3"
    # Opened elsewhere after the refresh: the view, renewed by the refresh and not by a call's
    # check, is trusted until it lapses, then the call asks Redis.
    await elsewhere.trip("d")
    assert await here.allow("d")
    await asyncio.sleep(VIEW.closed_view_s + 0.05)
    assert not await here.allow("d")
    assert (await here.refresh(["d"]))["d"] is BreakerState.OPEN
    assert not await here.allow("d")  # an open breaker is never taken as closed


async def test_a_failure_during_a_refresh_keeps_the_view_dropped(
    client: aioredis.Redis, key_prefix: str
) -> None:
    here = RedisBreaker(client, key_prefix, VIEW)
    elsewhere = RedisBreaker(client, key_prefix, VIEW)
    refreshing = asyncio.create_task(here.refresh(["d"]))
    await asyncio.sleep(0)  # the refresh has asked; its answer (closed) is on its way
    await here.record("d", ok=False)  # drops the local view
    assert (await refreshing)["d"] is BreakerState.CLOSED
    await elsewhere.trip("d")
    assert not await here.allow("d")  # asked Redis: the refresh did not renew the view


async def test_refresh_with_redis_down_raises_and_keeps_the_counted_successes() -> None:
    down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        breaker = RedisBreaker(down, "tgtest-down", VIEW)
        breaker._closed_until["d"] = float("inf")  # as if a check had found it closed
        assert await breaker.record("d", ok=True) is BreakerState.CLOSED
        with pytest.raises(RedisError):
            await breaker.refresh(["d"])
        assert breaker._unsent == {"d": 1}
    finally:
        await down.aclose()


async def test_refresh_is_one_round_trip_and_survives_a_lost_script_cache(
    tmp_path: Path, key_prefix: str
) -> None:
    server = RedisServer(tmp_path)  # its own: the test flushes the script cache
    server.start()
    r = aioredis.Redis.from_url(server.url)
    try:
        breaker = RedisBreaker(r, key_prefix, FAST)
        await breaker.record("d", ok=False)
        before = (await r.info("commandstats")).get("cmdstat_script|exists", {}).get("calls", 0)
        states = await breaker.refresh(["d", "e"])
        assert states == {"d": BreakerState.CLOSED, "e": BreakerState.CLOSED}
        stats = await r.info("commandstats")
        assert stats.get("cmdstat_script|exists", {}).get("calls", 0) == before  # no 2nd trip
        await r.script_flush()  # as after a Redis restart
        for _ in range(3):
            await breaker.record("d", ok=False)
        assert await breaker.refresh(["d"]) == {"d": BreakerState.OPEN}
    finally:
        await r.aclose()
        server.stop()
