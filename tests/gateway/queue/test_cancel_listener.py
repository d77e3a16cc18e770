"""The worker's cancel listener on a real Redis: it hears what an edge publishes, and when its
subscription's connection is killed under it, it subscribes again (backing off) and hears the
next cancels; closed, it hears nothing more."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.queue.ownership.cancels import CancelListener


async def _heard_after_publishing(
    publisher: aioredis.Redis, channel: str, heard: list[str], tag: str
) -> bool:
    """Publish cancels until one is heard (the subscription may still be on its way; 5 s)."""
    for n in range(50):
        await publisher.publish(channel, f"{tag}-{n}")
        await asyncio.sleep(0.1)
        if any(h.startswith(tag) for h in heard):
            return True
    return False


async def test_cancels_are_heard_again_after_the_subscription_is_killed(
    redis_url: str, redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    channel = f"{key_prefix}:cancels"
    name = f"{key_prefix}-listener"
    listening = aioredis.Redis.from_url(redis_url, client_name=name)
    heard: list[str] = []
    hearing = CancelListener(listening, channel, heard.append)
    hearing.start()
    try:
        assert await _heard_after_publishing(redis_conn, channel, heard, "before")
        clients = await redis_conn.client_list(_type="pubsub")
        ids = [c["id"] for c in clients if c.get("name") == name]
        assert len(ids) == 1, clients
        await redis_conn.execute_command("CLIENT", "KILL", "ID", ids[0])
        assert await _heard_after_publishing(redis_conn, channel, heard, "after")
    finally:
        await asyncio.wait_for(hearing.aclose(), 5)
        await listening.aclose()
    heard.clear()
    await redis_conn.publish(channel, "closed")
    await asyncio.sleep(0.2)
    assert heard == []
