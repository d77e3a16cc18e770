"""Global capacity: slot leases per replica, shared by every process through Redis.

A replica's slots are one sorted set (``RedisKeys.slots``) of lease ids scored by their expiry in
milliseconds of Redis's own clock. Taking a slot is one Lua script: drop expired leases, refuse
when ``limit`` are held, else add the lease. A holder renews its leases well within the lease
time; a process that dies stops renewing, so its slots come back when the leases expire.

A renewal only extends leases that are still there: a lease released while its
renewal was on the way is not brought back. After a Redis loss, though, every lease is gone
while its job still runs, and new leases would be granted on top of them. So each tier's slot
sets have an *epoch* (``…:slots-epoch``, kept alive by the renewals): a renewal that finds it
missing starts a new one, and a holder whose last renewal saw another epoch (or none: its first)
adds its leases back, whether they were there or not. Every holder has its leases back within
one renewal period (a third of the lease time) of the loss; until then a replica may be given
more than its capacity. A lease released at the very moment of such a restoring renewal can come
back with it; nobody renews it, so it lapses within the lease time.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from gateway.coalescer import Coalescer
from gateway.queue.keys import RedisKeys

__all__ = ["SlotLeases", "epoch_key_of"]

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 4)
return 1
"""

# KEYS: the tier's epoch key, slot keys. ARGV: lease ms, the epoch last seen ('' if none),
# lease ids (one per slot key). Returns {leases kept or restored, the epoch}.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = t[1] .. '.' .. t[2]
  redis.call('SET', KEYS[1], epoch)
end
redis.call('PEXPIRE', KEYS[1], ttl * 4)
local restore = epoch ~= ARGV[2]
local kept = 0
for i = 2, #KEYS do
  if restore or redis.call('ZSCORE', KEYS[i], ARGV[i + 1]) then
    redis.call('ZADD', KEYS[i], now + ttl, ARGV[i + 1])
    kept = kept + 1
  end
  redis.call('PEXPIRE', KEYS[i], ttl * 4)
end
return {kept, epoch}
"""

_HELD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('ZCOUNT', key, '(' .. now, '+inf') end
return out
"""

# Like _HELD, and per key the leases whose id does not end in ARGV[1] (the idle mark).
_HELD_BUSY = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mark = ARGV[1]
local out = {}
for i, key in ipairs(KEYS) do
  local ids = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
  local busy = 0
  for _, id in ipairs(ids) do
    if string.sub(id, -#mark) ~= mark then busy = busy + 1 end
  end
  out[i] = {#ids, busy}
end
return out
"""

# KEYS: a slot set. ARGV: old lease id, new lease id. The lease keeps its expiry.
_RENAME = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], score, ARGV[2])
return 1
"""


def epoch_key_of(slot_key: str) -> str:
    """The epoch key of the tier whose slot set is ``slot_key`` (``RedisKeys.slots``): in the
    tier's hash tag, so one script touches both."""
    return RedisKeys.slots_epoch_of(slot_key)


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
        self._held_busy = redis.register_script(_HELD_BUSY)
        self._rename = redis.register_script(_RENAME)
        self._epochs: dict[str, bytes] = {}
        """Epoch key -> the epoch this process's last renewal saw there."""

    async def acquire(self, key: str, lease_id: str, limit: int) -> bool:
        """Take one slot of ``key`` unless ``limit`` are held."""
        return bool(await self._acquire(keys=[key], args=[lease_id, limit, self.lease_ms]))

    async def release(self, key: str, lease_id: str) -> None:
        if self._coalescer is not None:
            self._coalescer.send_nowait(lambda pipe: pipe.zrem(key, lease_id), "slot release")
            return
        await self._redis.zrem(key, lease_id)

    async def renew(self, leases: Sequence[tuple[str, str]]) -> int:
        """Extend ``(key, lease_id)`` leases, all of one tier; returns how many still existed
        (or, in a new epoch, were added back)."""
        if not leases:
            return 0
        keys = [k for k, _ in leases]
        ids = [i for _, i in leases]
        epoch_key = epoch_key_of(keys[0])
        known = self._epochs.get(epoch_key, b"")
        kept, epoch = await self._renew(keys=[epoch_key, *keys], args=[self.lease_ms, known, *ids])
        self._epochs[epoch_key] = bytes(epoch)
        return int(kept)

    async def rename(self, key: str, old_id: str, new_id: str) -> None:
        """Give a lease a new id, same expiry (gone already: nothing). Queued on the
        coalescer if there is one, so it stays in order with the lease's release."""
        if self._coalescer is not None:
            # the script's text, not its sha: no SCRIPT EXISTS round trip, never NOSCRIPT
            self._coalescer.send_nowait(
                lambda pipe: pipe.eval(_RENAME, 1, key, old_id, new_id), "slot lease rename"
            )
            return
        await self._rename(keys=[key], args=[old_id, new_id])

    async def held_busy(self, keys: Sequence[str], idle_mark: str) -> list[tuple[int, int]]:
        """Per key: unexpired leases, and those among them not marked idle (running work)."""
        if not keys:
            return []
        rows = await self._held_busy(keys=list(keys), args=[idle_mark])
        return [(int(total), int(busy)) for total, busy in rows]

    async def held(self, keys: Sequence[str]) -> list[int]:
        """Unexpired leases on each key."""
        if not keys:
            return []
        return [int(n) for n in await self._held(keys=list(keys), args=[])]
