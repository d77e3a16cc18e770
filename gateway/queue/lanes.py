"""Priority lanes and weighted fair share, as two Lua scripts on one tier's keys.

A tier's queue is one stream per (lane, tenant) plus, per lane, a sorted set of the tenants that
have work there, scored by *virtual time*: every job a tenant gets started adds ``1 / weight``
to its score, and a worker always serves the lowest score first. A tenant that bursts therefore
waits behind the others' fair share instead of starving them; one that (re)joins a lane starts at
the lane's lowest score, so idleness earns no credit. Lanes are strict: a worker takes
``standard`` only when ``interactive`` is empty, and ``batch`` only when that leaves room (fewer
than ``batch_limit`` slots of the tier held), so interactive work always finds a slot soon.

Both scripts touch only keys tagged ``{q:<tier>}``. The per-tenant streams are derived inside the
take script from the tier's tag (the lane sets name the tenants), so they stay in the tier's
Cluster slot though the script does not declare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.coalescer import Coalescer
from gateway.queue.keys import LANES, RedisKeys

__all__ = ["LaneQueue", "QueueFull", "Taken", "lane_of"]

_ENQUEUE = """
local lane_depth = KEYS[2 + tonumber(ARGV[5])]
local waiting = tonumber(redis.call('GET', lane_depth) or '0')
if waiting >= tonumber(ARGV[4]) then return -waiting - 1 end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[6], '0', 'MKSTREAM')
end
redis.call('XADD', KEYS[1], '*', 'j', ARGV[1], 'w', ARGV[3])
if not redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  local low = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local start = 0
  if low[2] then start = tonumber(low[2]) end
  redis.call('ZADD', KEYS[2], start, ARGV[2])
end
redis.call('INCR', lane_depth)
redis.call('LPUSH', KEYS[6], '1')
redis.call('LTRIM', KEYS[6], 0, 63)
redis.call('SADD', KEYS[7], KEYS[1])
return waiting + 1
"""

_TAKE = """
local tag, group, consumer = ARGV[1], ARGV[2], ARGV[3]
local batch_limit = tonumber(ARGV[4])
local lanes = {'interactive', 'standard', 'batch'}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for li = 1, 3 do
  local allowed = true
  if li == 3 and batch_limit >= 0 then
    local held = 0
    for k = 7, #KEYS do held = held + redis.call('ZCOUNT', KEYS[k], '(' .. now, '+inf') end
    if held > batch_limit then allowed = false end
  end
  if allowed then
    local tenants = redis.call('ZRANGE', KEYS[li], 0, -1)
    for _, tenant in ipairs(tenants) do
      local stream = tag .. ':jobs:' .. lanes[li] .. ':' .. tenant
      local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1,
                           'STREAMS', stream, '>')
      if r and r[1] and #r[1][2] > 0 then
        local entry = r[1][2][1]
        local fields = entry[2]
        local weight, job = 1, ''
        for k = 1, #fields, 2 do
          if fields[k] == 'w' then weight = tonumber(fields[k + 1])
          elseif fields[k] == 'j' then job = fields[k + 1] end
        end
        redis.call('ZINCRBY', KEYS[li], 1 / weight, tenant)
        redis.call('DECR', KEYS[li + 3])
        return {lanes[li], tenant, entry[1], job}
      end
      redis.call('ZREM', KEYS[li], tenant)
    end
  end
end
return false
"""


class QueueFull(Exception):
    def __init__(self, depth: int) -> None:
        super().__init__(f"{depth} jobs waiting")
        self.depth = depth


@dataclass(frozen=True, slots=True)
class Taken:
    """A job a worker took: where it came from (to acknowledge it) and its encoded body."""

    tier: str
    lane: str
    tenant: str
    entry_id: bytes
    job: bytes


def lane_of(priority: str) -> str:
    return priority if priority in LANES else "standard"


class LaneQueue:
    def __init__(
        self, redis: aioredis.Redis, keys: RedisKeys, *, coalescer: Coalescer | None = None
    ) -> None:
        """``coalescer``: acknowledgements are queued on it instead of awaited."""
        self._redis = redis
        self._keys = keys
        self._coalescer = coalescer
        self._enqueue = redis.register_script(_ENQUEUE)
        self._take = redis.register_script(_TAKE)

    def _lane_keys(self, tier: str) -> list[str]:
        k = self._keys
        return [k.lane_tenants(tier, lane) for lane in LANES] + [
            k.depth(tier, lane) for lane in LANES
        ]

    async def enqueue(
        self, *, tier: str, lane: str, tenant: str, job: bytes, weight: float, max_depth: int
    ) -> int:
        """Queue ``job``; returns its lane's depth with it, raises ``QueueFull`` when the lane
        already holds ``max_depth`` (per lane, so a batch flood never refuses interactive work)."""
        k = self._keys
        keys = [
            k.jobs(tier, lane, tenant),
            k.lane_tenants(tier, lane),
            *(k.depth(tier, name) for name in LANES),
            k.bell(tier),
            k.streams(tier),
        ]
        args: list[bytes | str | int | float] = [
            job,
            tenant,
            weight,
            max_depth,
            LANES.index(lane) + 1,
            k.group,
        ]
        depth = int(await self._enqueue(keys=keys, args=args))
        if depth < 0:
            raise QueueFull(-depth - 1)
        return depth

    async def take(
        self, tier: str, consumer: str, *, slot_keys: list[str], batch_limit: int
    ) -> Taken | None:
        """The next job of ``tier`` by lane, then fair share; ``batch_limit`` < 0 means no
        limit on batch."""
        keys = self._lane_keys(tier) + slot_keys
        args: list[str | int] = [self._keys.tier_tag(tier), self._keys.group, consumer, batch_limit]
        got: Any = await self._take(keys=keys, args=args)
        if not got:
            return None
        lane, tenant, entry_id, job = got
        return Taken(tier, _text(lane), _text(tenant), bytes(entry_id), bytes(job))

    def ack_later(self, taken: Taken) -> bool:
        """Queue the acknowledgement on the coalescer; ``False`` (nothing done) when there is
        no open coalescer: then ``ack``."""
        if self._coalescer is None or self._coalescer.closed:
            return False
        stream = self._keys.jobs(taken.tier, taken.lane, taken.tenant)
        group, entry_id = self._keys.group, taken.entry_id
        self._coalescer.send_nowait(lambda pipe: pipe.xack(stream, group, entry_id), "ack")
        self._coalescer.send_nowait(lambda pipe: pipe.xdel(stream, entry_id), "ack")
        return True

    async def ack(self, taken: Taken) -> None:
        if self.ack_later(taken):
            return
        stream = self._keys.jobs(taken.tier, taken.lane, taken.tenant)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xack(stream, self._keys.group, taken.entry_id)
            pipe.xdel(stream, taken.entry_id)
            await pipe.execute()

    async def depths(self, tier: str) -> dict[str, int]:
        values = await self._redis.mget([self._keys.depth(tier, lane) for lane in LANES])
        return {lane: int(v or 0) for lane, v in zip(LANES, values, strict=True)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
