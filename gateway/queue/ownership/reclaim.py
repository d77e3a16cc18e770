"""Crash recovery: finding jobs whose worker died, and taking over their claim.

A worker that runs a job keeps its stream entry's idle time low (``XCLAIM … JUSTID`` on its own
entries, ``touch``). An entry idle longer than ``min_idle_ms`` belongs to a worker that stopped
renewing: another worker takes it with ``XAUTOCLAIM`` (``orphans``) and may run it if its claim
still names a worker whose heartbeat is gone (``take_over``, one Lua script of
``gateway.queue.ownership.table``; a job started at once names its worker in the entry instead of a
claim key). A claim marked finished (its run booked, acknowledged and answered it; only the
acknowledgement was lost) is dropped: an answer that reached its client never runs again. A
claim held by the edge (the deadline passed, or the client left) is acknowledged and dropped —
the edge booked it, from the calls a run noted when the job had been handed back
(``gateway.queue.ownership.edge_booking``; a note still there is booked first, ``Worker``) — and a
claim of a live worker is left alone. A run books its row before it answers (``Worker``), so a
worker that died before booking had not answered either: its job runs again and is answered and
booked once. The run that finishes a job taken over books the calls of the runs before it
too, from the note they left (``gateway.queue.ownership.notes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from gateway.queue.client.streams import StreamEntry
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.table import OwnershipScripts, TakeOver

__all__ = ["Reclaimer", "TakeOver"]


class Reclaimer:
    def __init__(self, redis: aioredis.Redis, keys: RedisKeys, *, min_idle_ms: int) -> None:
        self._redis = redis
        self._keys = keys
        self.min_idle_ms = min_idle_ms
        self._scripts = OwnershipScripts(redis)

    async def streams(self, tier: str) -> list[str]:
        members: Any = await self._redis.smembers(self._keys.streams(tier))
        return sorted(m.decode() for m in members)

    async def orphans(self, stream: str, consumer: str, count: int = 1) -> list[StreamEntry]:
        """Entries of ``stream`` idle over ``min_idle_ms``, now pending to ``consumer``: up to
        ``count``, from anywhere in the pending list. ``XAUTOCLAIM`` looks at ``10 * count``
        pending entries a call and returns a cursor; it is followed to the end, so an orphan
        behind running jobs' entries is found now, not once those before it are acknowledged."""
        cursor: Any = "0-0"
        while True:
            reply: Any = await self._redis.xautoclaim(
                stream, self._keys.group, consumer, self.min_idle_ms, cursor, count=count
            )
            found = [(bytes(i), f) for i, f in reply[1] if f]
            cursor = reply[0]
            if found or cursor in (b"0-0", "0-0"):
                return found

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
        *,
        started_by: str = "",
    ) -> TakeOver:
        """The take-over step of ``gateway.queue.ownership.table``. ``started_by``: the worker an
        entry names as its owner (a job started at once, which has no claim key), treated as
        the claim when there is none."""
        return await self._scripts.take_over(
            self._keys.claim(tier, request_id),
            worker_id=worker_id,
            ttl_s=ttl_s,
            heartbeat_prefix=self._keys.tier_heartbeat(tier, ""),  # + the owner: claim's slot
            started_by=started_by,
        )
