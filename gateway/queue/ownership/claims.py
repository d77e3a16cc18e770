"""A worker's side of job ownership (the table is ``gateway.queue.ownership.table``): start a taken
job, take over a reclaimed one, hand one back, mark one finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from gateway.queue.jobs import Job
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import Taken
from gateway.queue.ownership.reclaim import Reclaimer
from gateway.queue.ownership.table import (
    EDGE_CLAIM,
    ClaimState,
    OwnershipScripts,
    Step,
    TakeOver,
    Verdict,
    state_of,
    transition,
)

__all__ = ["EDGE_CLAIM", "Reclaimed", "WorkerClaims", "claim_ttl"]


def claim_ttl(job: Job, base_s: int) -> int:
    """How long a claim on ``job`` lives: until ``base_s`` past its deadline (at least
    ``base_s``), like the job's run note. Every claim lives as long (the worker's own, the one
    an enqueue takes for the worker it hands the job to, the edge's, a finished one), so a job
    whose client left long before its deadline is never started by a worker that finds it
    later."""
    return max(int(job.deadline - time.time()) + base_s, base_s)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A job taken over from a worker presumed dead (its entry was idle too long)."""

    started_by: str = ""
    """The worker its entry names (``o``): a job started at once or handed over, whose owner
    counts as the claim when there is no claim key. Empty for a job taken from a lane."""


_TAKE_OVER_VERDICT = {
    TakeOver.RUN: Verdict.RUN,
    TakeOver.EDGE: Verdict.ANSWERED_BY_EDGE,
    TakeOver.ALIVE: Verdict.OWNER_ALIVE,
    TakeOver.FINISHED: Verdict.ALREADY_FINISHED,
}


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
        self._scripts = OwnershipScripts(redis)

    async def own(self, tier: str, job: Job, reclaimed: Reclaimed | None) -> Verdict:
        """Whether this worker runs ``job``: ``RUN``; else what to do with its entry
        (``ANSWERED_BY_EDGE``, ``ALREADY_FINISHED``, ``OTHER_WORKER``: acknowledge it;
        ``OWNER_ALIVE``: leave it, its worker lives)."""
        ttl = claim_ttl(job, self._ttl_s)
        if reclaimed is not None:
            result = await self._reclaimer.take_over(
                tier, job.request_id, self._worker_id, ttl, started_by=reclaimed.started_by
            )
            return _TAKE_OVER_VERDICT[result]
        key = self._keys.claim(tier, job.request_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(key, self._worker_id, nx=True, ex=ttl)
            pipe.get(key)
            won, holder = await pipe.execute()
        if won:
            return Verdict.RUN
        state = state_of(holder)
        if state is ClaimState.FREE:  # expired between the two commands: it was the edge's
            state = ClaimState.EDGE
        owner = "live" if state is ClaimState.RUNNING else "-"
        return transition(Step.WORKER_STARTS, state, owner).verdict

    async def release(self, tier: str, job: Job) -> bool:
        """Give the claim up (a job handed back at shutdown), if it is still this worker's:
        one compare-and-delete script."""
        return await self._scripts.release(self._keys.claim(tier, job.request_id), self._worker_id)

    def finish(self, pipe: Pipeline, taken: Taken, job: Job) -> None:
        """Acknowledge ``taken`` and mark the claim of ``job`` finished, in one script queued on
        ``pipe`` (behind the ledger event): a take-over then drops the job instead of running
        it again."""
        self._scripts.finish(
            pipe,
            self._keys.claim(taken.tier, job.request_id),
            stream=self._keys.jobs(taken.tier, taken.lane, taken.tenant),
            group=self._keys.group,
            entry_id=taken.entry_id,
            worker_id=self._worker_id,
            ttl_s=claim_ttl(job, self._ttl_s),
        )
