"""Priority lanes and weighted fair share, as two Lua scripts on one tier's keys, and the hand-off
of a job to an idle worker.

A tier's queue is one stream per (lane, tenant) plus, per lane, a sorted set of the tenants that
have work there, scored by *virtual time*: every job a tenant gets started adds ``1 / weight``
to its score, and a worker always serves the lowest score first. A tenant that bursts therefore
waits behind the others' fair share instead of starving them; one that (re)joins a lane starts at
the lane's lowest score, so idleness earns no credit. Lanes are strict: a worker takes
``standard`` only when ``interactive`` is empty, and ``batch`` only when that leaves room (fewer
than ``batch_limit`` slots of the tier held), so interactive work always finds a slot soon.

**Hand-off.** A worker whose take finds nothing registers, in the same script, as idle in the
tier (``RedisKeys.idle``, with an expiry it renews at every take), holding the slot it reserved.
An enqueue that may hand off (``Handoff``; not batch) and finds no job waiting in its lane or a
higher one (the depth counters: the same rule as direct start, so nothing is overtaken) takes
the most recently registered idle worker out of the set and, in the same script, takes the
request's claim for it, adds the job to the tenant's ``direct`` stream read into that worker's
pending list (``o`` names it), and pushes the entry on the worker's wake list, which the worker
blocks on together with the bell. The worker then starts the job without a take or a claim of
its own: one script and one wake-up instead of a wake-up, two scripts and a ``SET NX``. Each
registration is good for one job (the enqueue removes it), so a worker never gets more jobs
than the slot it holds; a take first collects what was handed over since, and
``withdraw`` (when the worker stops) takes it out of the set and returns what is left on its
list. A worker that dies while registered may be handed a job until its registration lapses
(``idle_ms``, about two bell periods); that job is in its pending list under its claim, and
another worker's reclaimer runs it once its heartbeat is gone, as for any job it had started.

Every key the scripts touch is tagged ``{q:<tier>}``. The per-tenant streams are named inside
the take script (the lane sets name the tenants), and an idle worker's wake list inside the
enqueue script (the idle set names the worker), each from a prefix ``RedisKeys`` gives in
``ARGV`` (``jobs(tier, lane, "")``, ``wake(tier, "")``), so they stay in the tier's Cluster slot
though the scripts do not declare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.coalescer import CommandQueue
from gateway.queue.keys import DIRECT_LANE, LANES, RedisKeys

__all__ = ["HANDED_OFF", "Handoff", "LaneQueue", "QueueFull", "Taken", "lane_of"]

HANDED_OFF = 0
"""What ``LaneQueue.enqueue`` returns for a job handed straight to an idle worker."""

# KEYS: jobs stream, lane set, depth x3, bell, streams set; to hand off: direct stream, idle set,
# claim. ARGV: job, tenant, weight, max depth, lane index (1-3), group; to hand off: claim ttl (s),
# the wake lists' prefix.
_ENQUEUE = """
local li = tonumber(ARGV[5])
local lane_depth = KEYS[2 + li]
local waiting = tonumber(redis.call('GET', lane_depth) or '0')
if waiting >= tonumber(ARGV[4]) then return -waiting - 1 end
if #KEYS == 10 then
  local clear = true
  for i = 1, li do
    if tonumber(redis.call('GET', KEYS[2 + i]) or '0') > 0 then clear = false break end
  end
  if clear then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
    local worker = redis.call('ZREVRANGE', KEYS[9], 0, 0)[1]
    if worker and redis.call('SET', KEYS[10], worker, 'NX', 'EX', ARGV[7]) then
      redis.call('ZREM', KEYS[9], worker)
      if redis.call('EXISTS', KEYS[8]) == 0 then
        redis.call('XGROUP', 'CREATE', KEYS[8], ARGV[6], '0', 'MKSTREAM')
      end
      redis.call('SADD', KEYS[7], KEYS[8])
      local id = redis.call('XADD', KEYS[8], '*', 'j', ARGV[1], 'w', ARGV[3], 'o', worker)
      redis.call('XREADGROUP', 'GROUP', ARGV[6], worker, 'COUNT', 1, 'STREAMS', KEYS[8], '>')
      local wake = ARGV[8] .. worker
      redis.call('RPUSH', wake, id .. ' ' .. #ARGV[2] .. ' ' .. ARGV[2] .. ARGV[1])
      redis.call('EXPIRE', wake, ARGV[7])
      return 0
    end
  end
end
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

# KEYS: lane sets x3, depth x3, idle set, taken counters x3, slot keys... ARGV: the wake lists'
# prefix, group, consumer, batch limit, idle ms (0: the caller does not wait for hand-offs), the
# job streams' prefix of each lane x3.
_TAKE = """
local wake, group, consumer = ARGV[1], ARGV[2], ARGV[3]
local batch_limit = tonumber(ARGV[4])
local idle_ms = tonumber(ARGV[5])
if idle_ms > 0 then
  redis.call('ZREM', KEYS[7], consumer)
  local handed = redis.call('LPOP', wake .. consumer)
  if handed then return {handed} end
end
local lanes = {'interactive', 'standard', 'batch'}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for li = 1, 3 do
  local allowed = true
  if li == 3 and batch_limit >= 0 then
    local held = 0
    for k = 11, #KEYS do held = held + redis.call('ZCOUNT', KEYS[k], '(' .. now, '+inf') end
    if held > batch_limit then allowed = false end
  end
  if allowed then
    local tenants = redis.call('ZRANGE', KEYS[li], 0, -1)
    for _, tenant in ipairs(tenants) do
      local stream = ARGV[5 + li] .. tenant
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
        redis.call('INCR', KEYS[li + 7])
        return {lanes[li], tenant, entry[1], job}
      end
      redis.call('ZREM', KEYS[li], tenant)
    end
  end
end
if idle_ms > 0 then redis.call('ZADD', KEYS[7], now + idle_ms, consumer) end
return false
"""

_WITHDRAW = """
redis.call('ZREM', KEYS[1], ARGV[1])
local handed = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
return handed
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
    claimed: bool = False
    """Handed over by an enqueue, which took the request's claim for this worker."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """What an enqueue needs to hand a job straight to an idle worker."""

    request_id: str
    claim_ttl_s: int
    """How long the claim it takes for the worker lives (as the worker's own would)."""


def lane_of(priority: str) -> str:
    return priority if priority in LANES else "standard"


class LaneQueue:
    def __init__(
        self, redis: aioredis.Redis, keys: RedisKeys, *, coalescer: CommandQueue | None = None
    ) -> None:
        """``coalescer``: acknowledgements are queued on it instead of awaited."""
        self._redis = redis
        self._keys = keys
        self._coalescer = coalescer
        self._enqueue = redis.register_script(_ENQUEUE)
        self._take = redis.register_script(_TAKE)
        self._withdraw = redis.register_script(_WITHDRAW)

    def _lane_keys(self, tier: str) -> list[str]:
        k = self._keys
        return [k.lane_tenants(tier, lane) for lane in LANES] + [
            k.depth(tier, lane) for lane in LANES
        ]

    async def enqueue(
        self,
        *,
        tier: str,
        lane: str,
        tenant: str,
        job: bytes,
        weight: float,
        max_depth: int,
        handoff: Handoff | None = None,
    ) -> int:
        """Queue ``job``; returns its lane's depth with it, raises ``QueueFull`` when the lane
        already holds ``max_depth`` (per lane, so a batch flood never refuses interactive work).
        With ``handoff`` (never for batch, whose headroom only a worker can check) a job that
        need not wait goes to an idle worker instead: ``HANDED_OFF``, and its claim is taken."""
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
        if handoff is not None and lane != "batch":
            keys += [
                k.jobs(tier, DIRECT_LANE, tenant),
                k.idle(tier),
                k.claim(tier, handoff.request_id),
            ]
            args += [handoff.claim_ttl_s, k.wake(tier, "")]
        depth = int(await self._enqueue(keys=keys, args=args))
        if depth < 0:
            raise QueueFull(-depth - 1)
        return depth

    async def take(
        self,
        tier: str,
        consumer: str,
        *,
        slot_keys: list[str],
        batch_limit: int,
        idle_ms: int = 0,
    ) -> Taken | None:
        """The next job of ``tier`` by lane, then fair share; ``batch_limit`` < 0 means no
        limit on batch. ``idle_ms`` > 0: the caller holds a slot and, finding nothing, waits on
        ``wake_keys``; it is registered as idle for that long (and first gets any job handed to
        it since its last registration)."""
        keys = [
            *self._lane_keys(tier),
            self._keys.idle(tier),
            *(self._keys.taken(tier, lane) for lane in LANES),
            *slot_keys,
        ]
        args: list[str | int] = [
            self._keys.wake(tier, ""),
            self._keys.group,
            consumer,
            batch_limit,
            idle_ms,
            *(self._keys.jobs(tier, lane, "") for lane in LANES),
        ]
        got: Any = await self._take(keys=keys, args=args)
        if not got:
            return None
        if len(got) == 1:
            return self.handed(tier, got[0])
        lane, tenant, entry_id, job = got
        return Taken(tier, _text(lane), _text(tenant), bytes(entry_id), bytes(job))

    def wake_keys(self, tier: str, consumer: str) -> list[str]:
        """What an idle worker blocks on (``BLPOP``): its wake list, then the tier's bell."""
        return [self._keys.wake(tier, consumer), self._keys.bell(tier)]

    def handed(self, tier: str, payload: bytes) -> Taken:
        """The job of a wake-list item (``<entry id> <tenant length> <tenant><job>``)."""
        entry_id, size, rest = payload.split(b" ", 2)
        cut = int(size)
        return Taken(tier, DIRECT_LANE, rest[:cut].decode(), entry_id, rest[cut:], claimed=True)

    async def withdraw(self, tier: str, consumer: str) -> list[Taken]:
        """Stop being handed jobs of ``tier``; the ones handed over and not yet collected."""
        got: Any = await self._withdraw(
            keys=[self._keys.idle(tier), self._keys.wake(tier, consumer)], args=[consumer]
        )
        return [self.handed(tier, bytes(item)) for item in got or ()]

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

    async def not_started(self, taken: Taken) -> None:
        """A job taken from a lane that its worker skips (too late to finish, or the edge
        answered it): take it back off the lane's count of taken jobs, which measures how fast
        the lane's jobs *start* (deadline admission); skips would overstate it."""
        if taken.lane not in LANES:
            return
        counter = self._keys.taken(taken.tier, taken.lane)
        if self._coalescer is not None and not self._coalescer.closed:
            self._coalescer.send_nowait(lambda pipe: pipe.decr(counter), "taken")
            return
        await self._redis.decr(counter)

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
