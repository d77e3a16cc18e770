"""Claims: who owns a job's outcome. One ``SET NX`` on ``RedisKeys.claim`` decides between the
worker about to start a job and the edge at its deadline (``gateway.queue.dispatcher``);
whoever wins answers and books the request.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from gateway.queue.jobs import Job
from gateway.queue.keys import RedisKeys
from gateway.queue.reclaim import Reclaimer

__all__ = ["EDGE_CLAIM", "WorkerClaims", "claim_ttl"]

EDGE_CLAIM = "edge"
"""The value of a claim the edge took (a worker's claim holds its worker id)."""


def claim_ttl(job: Job, base_s: int) -> int:
    """How long a claim on ``job`` lives: until ``base_s`` past its deadline (at least
    ``base_s``), like the job's run note. Every claim lives as long (the worker's own, the one
    an enqueue takes for the worker it hands the job to, the edge's), so a job whose client left
    long before its deadline is never started by a worker that finds it later."""
    return max(int(job.deadline - time.time()) + base_s, base_s)


class WorkerClaims:
    """A worker's side of the claims."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        reclaimer: Reclaimer,
        *,
        worker_id: str,
        ttl_s: int,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._reclaimer = reclaimer
        self._worker_id = worker_id
        self._ttl_s = ttl_s

    async def own(self, tier: str, job: Job, reclaimed: bool | str) -> str:
        """``mine`` (run it), ``edge`` (the edge answered and booked it: drop it, once a
        reclaimed job's noted calls are known to be booked) or ``alive`` (a reclaimed job whose
        worker still lives: leave it). ``reclaimed``: taken over from a dead worker (a string:
        the worker its entry names, for a job that was started at once)."""
        if reclaimed:
            started_by = reclaimed if isinstance(reclaimed, str) else ""
            return await self._reclaimer.take_over(
                tier,
                job.request_id,
                self._worker_id,
                claim_ttl(job, self._ttl_s),
                EDGE_CLAIM,
                started_by=started_by,
            )
        won = await self._redis.set(
            self._keys.claim(tier, job.request_id),
            self._worker_id,
            nx=True,
            ex=claim_ttl(job, self._ttl_s),
        )
        return "mine" if won else "edge"

    async def release(self, tier: str, job: Job) -> None:
        """Give the claim up (a job handed back at shutdown), if it is still this worker's."""
        key = self._keys.claim(tier, job.request_id)
        if await self._redis.get(key) == self._worker_id.encode():
            await self._redis.delete(key)
