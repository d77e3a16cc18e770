"""Global capacity: slot leases per replica, shared by every process through Redis.

A replica's slots are one sorted set (``RedisKeys.slots``) of lease ids scored by their expiry in
milliseconds of Redis's own clock. Taking a slot is one Lua script: drop expired leases, refuse
when ``limit`` are held, else add the lease. A holder renews its leases well within the lease
time; a process that dies stops renewing, so its slots come back when the leases expire.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from gateway.coalescer import Coalescer

__all__ = ["SlotLeases"]

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 4)
return 1
"""

_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local kept = 0
for i, key in ipairs(KEYS) do
  if redis.call('ZADD', key, 'XX', 'CH', now + ttl, ARGV[i + 1]) == 1 then kept = kept + 1 end
  redis.call('PEXPIRE', key, ttl * 4)
end
return kept
"""

_HELD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('ZCOUNT', key, '(' .. now, '+inf') end
return out
"""


class SlotLeases:
    """Leases on replica slots. ``key`` names are ``RedisKeys.slots`` values."""

    def __init__(
        self, redis: aioredis.Redis, *, lease_ms: int = 30_000, coalescer: Coalescer | None = None
    ) -> None:
        """``coalescer``: releases are queued on it instead of awaited (the slot comes back a
        round trip later; the caller does not wait for it)."""
        self._redis = redis
        self._coalescer = coalescer
        self.lease_ms = lease_ms
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._held = redis.register_script(_HELD)

    async def acquire(self, key: str, lease_id: str, limit: int) -> bool:
        """Take one slot of ``key`` unless ``limit`` are held."""
        return bool(await self._acquire(keys=[key], args=[lease_id, limit, self.lease_ms]))

    async def release(self, key: str, lease_id: str) -> None:
        if self._coalescer is not None:
            self._coalescer.send_nowait(lambda pipe: pipe.zrem(key, lease_id), "slot release")
            return
        await self._redis.zrem(key, lease_id)

    async def renew(self, leases: Sequence[tuple[str, str]]) -> int:
        """Extend ``(key, lease_id)`` leases; returns how many still existed."""
        if not leases:
            return 0
        keys = [k for k, _ in leases]
        ids = [i for _, i in leases]
        return int(await self._renew(keys=keys, args=[self.lease_ms, *ids]))

    async def held(self, keys: Sequence[str]) -> list[int]:
        """Unexpired leases on each key."""
        if not keys:
            return []
        return [int(n) for n in await self._held(keys=list(keys), args=[])]
