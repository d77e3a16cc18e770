"""Direct start: a job that would be taken at once skips the wait in the queue.

When nothing waits in a tier's lanes at or above a job's lane and one of its replicas has a free
slot, queueing it would only make it the next job taken. The edge's own worker then starts it
at once, in one Lua script that does what enqueue + take would have done, atomically:

- refuse (the job is queued as usual) when a job waits in the job's lane or a higher one, so
  lane order and fair share are kept; a batch job also needs the batch headroom;
- take a slot lease on the first of the given replicas (best first) that has one free;
- add the job to the tenant's ``direct`` stream and read it into the worker's pending list,
  with the worker's id in the entry (``o``), so that if the process dies the reclaimer of
  another worker finds it like any started job and runs it again (its claim names a worker
  whose heartbeat is gone).

Every entry of a ``direct`` stream is read by the script that adds it (here, or in the enqueue
script that hands a job to an idle worker, ``gateway.queue.lanes``), so ``XREADGROUP >`` returns
exactly that entry. All keys carry the tier's tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.queue.keys import DIRECT_LANE, LANES, RedisKeys
from gateway.queue.lanes import Taken

__all__ = ["DIRECT_LANE", "DirectStart", "Started"]

# KEYS: direct stream, depth x3 (lane order), streams set, slot keys...
# ARGV: job, weight, lane index (1-3), group, consumer, lease id, lease ms, batch limit, limits...
_START = """
local li = tonumber(ARGV[3])
for i = 1, li do
  if tonumber(redis.call('GET', KEYS[1 + i]) or '0') > 0 then return false end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first_slot = 6
if li == 3 and tonumber(ARGV[8]) >= 0 then
  local held = 0
  for k = first_slot, #KEYS do held = held + redis.call('ZCOUNT', KEYS[k], '(' .. now, '+inf') end
  if held > tonumber(ARGV[8]) then return false end
end
local lease_ms = tonumber(ARGV[7])
local picked = 0
for k = first_slot, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
  if redis.call('ZCARD', KEYS[k]) < tonumber(ARGV[8 + k - first_slot + 1]) then
    redis.call('ZADD', KEYS[k], now + lease_ms, ARGV[6])
    redis.call('PEXPIRE', KEYS[k], lease_ms * 4)
    picked = k - first_slot + 1
    break
  end
end
if picked == 0 then return false end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[4], '0', 'MKSTREAM')
end
redis.call('SADD', KEYS[5], KEYS[1])
redis.call('XADD', KEYS[1], '*', 'j', ARGV[1], 'w', ARGV[2], 'o', ARGV[5])
local r = redis.call('XREADGROUP', 'GROUP', ARGV[4], ARGV[5], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
return {picked, r[1][2][1][1]}
"""


@dataclass(frozen=True, slots=True)
class Started:
    """A job started at once: which of the offered slots it holds, and its stream entry."""

    slot: int
    """Index into the ``slots`` offered to ``DirectStart.start``."""
    taken: Taken


class DirectStart:
    def __init__(self, redis: aioredis.Redis, keys: RedisKeys) -> None:
        self._keys = keys
        self._start = redis.register_script(_START)

    async def start(
        self,
        *,
        tier: str,
        lane: str,
        tenant: str,
        job: bytes,
        weight: float,
        consumer: str,
        slots: Sequence[tuple[str, int]],
        lease_id: str,
        lease_ms: int,
        batch_limit: int,
    ) -> Started | None:
        """Start ``job`` now on the first of ``slots`` (slot key, capacity) with room, or
        ``None`` when it must queue. ``batch_limit`` < 0: no headroom kept for batch."""
        if not slots:
            return None
        k = self._keys
        stream = k.jobs(tier, DIRECT_LANE, tenant)
        keys = [stream, *(k.depth(tier, name) for name in LANES), k.streams(tier)]
        keys.extend(key for key, _ in slots)
        args: list[bytes | str | int | float] = [
            job,
            weight,
            LANES.index(lane) + 1,
            k.group,
            consumer,
            lease_id,
            lease_ms,
            batch_limit,
            *(limit for _, limit in slots),
        ]
        got: Any = await self._start(keys=keys, args=args)
        if not got:
            return None
        picked, entry_id = got
        return Started(int(picked) - 1, Taken(tier, DIRECT_LANE, tenant, bytes(entry_id), job))
