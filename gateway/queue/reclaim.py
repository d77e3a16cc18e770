"""Crash recovery: finding jobs whose worker died, and taking over their claim.

A worker that runs a job keeps its stream entry's idle time low (``XCLAIM … JUSTID`` on its own
entries, ``touch``). An entry idle longer than ``min_idle_ms`` belongs to a worker that stopped
renewing: another worker takes it with ``XAUTOCLAIM`` (``orphans``) and may run it if its claim
still names a worker whose heartbeat is gone (``take_over``, one Lua script; a job started at
once names its worker in the entry instead of a claim key). A claim held by the
edge (the deadline passed, or the client left) is acknowledged and dropped — the edge booked it,
from the calls a run noted when the job had been handed back (``gateway.queue.noted``; a note
still there is booked first, ``Worker``) — and a claim of a live worker is left alone.
The ledger is idempotent by request id and the edge relays only the first final reply, so a job
run twice (its first worker died after answering, before acknowledging) is still answered and
booked once. The run that finishes a job taken over books the calls of the runs before it too,
from the note they left (``gateway.queue.notes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from gateway.queue.streams import StreamEntry

__all__ = ["Reclaimer", "TakeOver"]

_TAKE_OVER = """
local owner = redis.call('GET', KEYS[1])
if not owner and ARGV[5] ~= '' then owner = ARGV[5] end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 'mine'
end
if owner == ARGV[1] then return 'mine' end
if owner == ARGV[3] then return 'edge' end
if redis.call('EXISTS', ARGV[4] .. owner) == 1 then return 'alive' end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 'mine'
"""

TakeOver = str
"""``mine`` (run it), ``edge`` (the edge answered 504: drop it), ``alive`` (leave it)."""


class Reclaimer:
    def __init__(self, redis: aioredis.Redis, keys: RedisKeys, *, min_idle_ms: int) -> None:
        self._redis = redis
        self._keys = keys
        self.min_idle_ms = min_idle_ms
        self._take_over = redis.register_script(_TAKE_OVER)

    async def streams(self, tier: str) -> list[str]:
        members: Any = await self._redis.smembers(self._keys.streams(tier))
        return sorted(m.decode() for m in members)

    async def orphans(self, stream: str, consumer: str, count: int = 1) -> list[StreamEntry]:
        """Entries of ``stream`` idle over ``min_idle_ms``, now pending to ``consumer``."""
        reply: Any = await self._redis.xautoclaim(
            stream, self._keys.group, consumer, self.min_idle_ms, "0-0", count=count
        )
        return [(bytes(i), f) for i, f in reply[1] if f]

    async def touch(self, stream: str, consumer: str, entry_ids: Sequence[bytes]) -> None:
        """Reset the idle time of entries this consumer is still working on."""
        if entry_ids:
            await self._redis.xclaim(
                stream, self._keys.group, consumer, 0, list(entry_ids), justid=True
            )

    async def take_over(
        self,
        tier: str,
        request_id: str,
        worker_id: str,
        ttl_s: int,
        edge: str,
        *,
        started_by: str = "",
    ) -> TakeOver:
        """``started_by``: the worker an entry names as its owner (a job started at once, which
        has no claim key), treated as the claim when there is none."""
        prefix = self._keys.tier_heartbeat(tier, "")  # + the owner: in the claim's slot
        result: Any = await self._take_over(
            keys=[self._keys.claim(tier, request_id)],
            args=[worker_id, ttl_s, edge, prefix, started_by],
        )
        return result.decode() if isinstance(result, bytes) else str(result)
