"""Telling every gateway process that tenants or keys changed: a version counter in Redis
(checked on a short poll, so a lost message costs at most one poll interval) and a pub/sub
message (so the usual case takes one round trip)."""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys

__all__ = ["AuthChanges"]


class AuthChanges:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        keys = RedisKeys(prefix)
        self.version_key = keys.auth_version
        self.channel = keys.auth_channel

    async def announce(self) -> int:
        """Call after the SQL change has committed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.incr(self.version_key)
            pipe.publish(self.channel, b"changed")
            version, _receivers = await pipe.execute()
        return int(version)

    async def version(self) -> int:
        value = await self.redis.get(self.version_key)
        return int(value) if value is not None else 0
