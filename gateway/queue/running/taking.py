"""One tier's take loop: hold a slot, then take the next job for it.

A worker runs one ``TakeLoop`` per tier. Each step first holds a slot: one reserved on a
replica of the tier (``BackendPool.reserve``, marked idle until a job runs on it), or, for a
tier with no replica in the pool, one of the process's own slots. Only then does it take a job
(``LaneQueue.take``: lanes by priority, tenants by fair share); finding none, the take script
registers it as idle and it blocks on its wake list and the tier's bell, where an edge hands a
job over or rings. The job goes to ``spawn`` with the slot, and the next step holds another.

The pauses are tenacity's: no free slot, 2 ms growing to 50 ms between tries
(``until_reserved``, as in the pool's own wait for a slot); a Redis that fails, 50 ms growing
to 1 s (the ``Loop``'s backoff; the slot held meanwhile is kept). A stopped loop gives back the
slot it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
import tenacity
from redis.exceptions import RedisError

from gateway.loops import Loop, Sleep
from gateway.queue.client.connection import BLOCKING_READ_S
from gateway.queue.lanes import LaneQueue, Taken
from gateway.queue.replicas.pool import BackendPool, Reservation, until_reserved

__all__ = ["BatchLimit", "Spawn", "TakeLoop"]

log = logging.getLogger(__name__)

BELL_S = BLOCKING_READ_S
"""How long an idle worker blocks on its wake list and the bell before it takes again."""
IDLE_MS = int(BELL_S * 2000)
"""How long an idle registration lasts: a waiting worker renews it every bell period."""
FAILING_S = (0.05, 1.0)
"""The pause after a step that Redis failed: first, and at most."""

Spawn = Callable[[Taken, Reservation | None, asyncio.Semaphore | None], None]
"""Run a taken job on the slot held for it (a reservation, or the process's own slot)."""
BatchLimit = Callable[[str, Sequence[str]], int]
"""A tier's batch limit (``LaneQueue.take``) given its replicas' slot keys."""


class TakeLoop:
    def __init__(
        self,
        tier: str,
        *,
        deployments: Sequence[str],
        slots: int,
        worker_id: str,
        pool: BackendPool,
        lanes: LaneQueue,
        blocking: aioredis.Redis,
        batch_limit: BatchLimit,
        spawn: Spawn,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """``deployments``: the tier's in the pool (none: ``slots`` of the process's own);
        ``sleep``: what every pause awaits (tests record the pauses instead)."""
        self.tier = tier
        self._deployments = deployments
        self._worker_id = worker_id
        self._pool = pool
        self._lanes = lanes
        self._blocking = blocking
        self._batch_limit = batch_limit
        self._spawn = spawn
        self._sleep = sleep
        self._wake_keys = lanes.wake_keys(tier, worker_id)
        self._local = asyncio.Semaphore(slots)
        self._reservation: Reservation | None = None
        self._have_local = False
        self._loop = Loop(
            f"tiergate-worker-{tier}",
            self.step,
            every_s=0,
            catch=(RedisError, OSError),
            on_error=self._failed,
            backoff=tenacity.wait_exponential(multiplier=FAILING_S[0], max=FAILING_S[1]),
            sleep=sleep,
        )

    @property
    def name(self) -> str:
        return self._loop.name

    async def run(self) -> None:
        """Take until cancelled; then give back the slot held."""
        try:
            await self._loop.run()
        finally:
            if self._reservation is not None:
                await self._pool.release(self._reservation)
                self._reservation = None
            if self._have_local:
                self._local.release()
                self._have_local = False

    async def step(self) -> None:
        """Hold a slot, take a job (or wait for one to be handed over) and spawn it."""
        if self._deployments and self._reservation is None:
            self._reservation = await self._free_slot()
        elif not self._deployments and not self._have_local:
            await self._local.acquire()
            self._have_local = True
        taken = await self._take()
        if taken is None:
            return  # the bell rang, or the wait ended: take again
        self._spawn(taken, self._reservation, self._local if self._have_local else None)
        self._reservation, self._have_local = None, False
        # Let the job reach its backend call before this loop's next reservation and take go
        # to Redis: their sends would otherwise come first on the event loop.
        await asyncio.sleep(0)

    async def _free_slot(self) -> Reservation:
        """An idle reservation on one of the tier's replicas: tried at once, then again after
        pauses growing from 2 to 50 ms while every slot is busy."""
        return await until_reserved(
            lambda: self._pool.reserve(self._deployments, idle=True), sleep=self._sleep
        )

    async def _take(self) -> Taken | None:
        slot_keys = self._pool.slot_keys(self._deployments)  # replicas come and go
        taken = await self._lanes.take(
            self.tier,
            self._worker_id,
            slot_keys=slot_keys,
            batch_limit=self._batch_limit(self.tier, slot_keys),
            idle_ms=IDLE_MS,
        )
        if taken is not None:
            return taken
        woke: Any = await self._blocking.blpop(self._wake_keys, timeout=BELL_S)
        if woke is None or woke[0] != self._wake_keys[0].encode():
            return None
        return self._lanes.handed(self.tier, bytes(woke[1]))

    def _failed(self, exc: BaseException) -> None:
        log.warning("worker cannot take from %s: %s", self.tier, type(exc).__name__)
