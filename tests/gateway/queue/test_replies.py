"""The edge's reply reader against a real Redis: delivery to waiters, and how often it trims."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.queue.jobs import Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.replies import ReplyRouter

_ENTRIES = 300
"""Enough entries for an approximate trim to drop whole stream nodes (100 entries each)."""


async def _deliver_all(router: ReplyRouter, redis: aioredis.Redis, key: str) -> None:
    """Send ``_ENTRIES`` replies for one waiter and wait until the reader has handed them over."""
    queue = router.register("r1")
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(_ENTRIES):
            pipe.xadd(key, Reply("r1", "chunk", {"n": n}).fields())
        await pipe.execute()
    got = [await asyncio.wait_for(queue.get(), 5) for _ in range(_ENTRIES)]
    assert [r.data["n"] for r in got if isinstance(r, Reply)] == list(range(_ENTRIES))


async def test_what_was_read_is_trimmed_once_the_period_is_up(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    key = RedisKeys(key_prefix).replies("trims")
    router = ReplyRouter(redis_conn, key, block_ms=100, trim_every_s=0.0)
    router.start()
    try:
        await _deliver_all(router, redis_conn, key)
        for _ in range(50):
            if await redis_conn.xlen(key) < _ENTRIES:
                break
            await asyncio.sleep(0.05)
        assert await redis_conn.xlen(key) < _ENTRIES
    finally:
        await router.aclose()


async def test_no_trim_on_every_read(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    key = RedisKeys(key_prefix).replies("keeps")
    router = ReplyRouter(redis_conn, key, block_ms=100, trim_every_s=3600.0)
    router.start()
    try:
        await _deliver_all(router, redis_conn, key)
        await asyncio.sleep(0.3)  # a few more reads go by
        assert await redis_conn.xlen(key) == _ENTRIES
    finally:
        await router.aclose()
