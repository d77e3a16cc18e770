"""The Redis client's pool waits for a free connection instead of failing a burst."""

from __future__ import annotations

import asyncio

from gateway.queue.connection import redis_client


async def test_a_burst_beyond_the_pool_waits_for_connections(
    redis_url: str, key_prefix: str
) -> None:
    client = redis_client(redis_url, socket_timeout=2.0, max_connections=3)
    try:
        key = f"{key_prefix}:empty"
        # Twelve blocking commands on three connections: each holds one for 0.1 s.
        results = await asyncio.gather(
            *(client.execute_command("BLPOP", key, 0.1) for _ in range(12)),
            return_exceptions=True,
        )
    finally:
        await client.aclose()
    assert results == [None] * 12
