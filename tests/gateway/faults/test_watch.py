"""The cached view of open breakers that feeds the router's Signals (real Redis)."""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.faults.breaker import BreakerConfig, RedisBreaker
from gateway.faults.watch import BreakerWatch


async def test_refresh_sees_breakers_opened_by_any_process(redis_url: str, key_prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        config = BreakerConfig(min_calls=2, open_s=30)
        elsewhere = RedisBreaker(client, key_prefix, config)  # another process's breaker
        states: dict[str, str] = {}
        watch = BreakerWatch(
            RedisBreaker(client, key_prefix, config),
            ["a", "b"],
            set_state=lambda d, s: states.__setitem__(d, s),
        )
        await watch.refresh()
        assert watch.open_now == frozenset()
        assert states == {"a": "closed", "b": "closed"}
        await elsewhere.record("b", ok=False)
        await elsewhere.record("b", ok=False)
        await watch.refresh()
        assert watch.open_now == frozenset({"b"})
        assert states == {"a": "closed", "b": "open"}
        await elsewhere.reset("b")
        await watch.refresh()
        assert watch.open_now == frozenset() and states["b"] == "closed"
    finally:
        await client.aclose()
