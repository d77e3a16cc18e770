"""The worker: take jobs from the tier queues, run them, send replies, book the ledger entry.

One ``Worker`` per process serves every tier. For each tier it first reserves a slot on a
replica of the tier (``BackendPool.reserve``, global across processes), and only then takes a
job (``LaneQueue.take``: lanes by priority, tenants by fair share); the job's first backend call
uses that slot. Work beyond capacity therefore waits in Redis, not on the GPU servers. A tier
with no replica in the pool (no slot to reserve) is limited by a per-process count instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.accounting.writer import LedgerWriter
from gateway.queue.executor import Emit, Executor
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue, Taken
from gateway.queue.pool import BackendPool, Reservation

__all__ = ["Worker"]

log = logging.getLogger(__name__)

_REPLY_MAXLEN = 100_000
_HEARTBEAT_S = 2.0
_BELL_S = 1.0
_NO_SLOT_S = (0.002, 0.05)
_SVC_ALPHA = 0.2


class Worker:
    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        blocking_redis: aioredis.Redis,
        keys: RedisKeys,
        executor: Executor,
        ledger: LedgerWriter,
        capacity: Mapping[str, int],
        worker_id: str,
        claim_ttl_s: int,
        pool: BackendPool | None = None,
        tiers: Mapping[str, Sequence[str]] | None = None,
        batch_headroom: float = 0.1,
    ) -> None:
        """``capacity``: per-process slots of each tier that has no replica in ``pool``;
        ``tiers``: each tier's deployments, in order; ``batch_headroom``: share of a tier's
        slots batch work may not take."""
        self._redis = redis
        self._blocking = blocking_redis
        self._keys = keys
        self._executor = executor
        self._ledger = ledger
        self._pool = pool or BackendPool({})
        self._tiers = {t: [d for d in deps if d in self._pool] for t, deps in (tiers or {}).items()}
        self._capacity = {tier: n for tier, n in capacity.items() if n > 0}
        for tier, deps in self._tiers.items():
            if deps:
                self._capacity[tier] = sum(self._pool.capacity(d) for d in deps)
        self._headroom = batch_headroom
        self._lanes = LaneQueue(redis, keys)
        self.worker_id = worker_id
        self._claim_ttl_s = claim_ttl_s
        self._tasks: list[asyncio.Task[None]] = []
        self._jobs: set[asyncio.Task[None]] = set()
        self._service_s: dict[str, float] = {}

    def start(self) -> None:
        for tier, slots in self._capacity.items():
            self._tasks.append(
                asyncio.create_task(self._consume(tier, slots), name=f"tiergate-worker-{tier}")
            )
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="tiergate-heartbeat"))

    @property
    def running(self) -> int:
        return len(self._jobs)

    async def stop_taking(self) -> None:
        """Stop taking new jobs; the ones running go on."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def aclose(self, *, drain_s: float = 10.0) -> None:
        await self.stop_taking()
        if self._jobs:
            await asyncio.wait(self._jobs, timeout=drain_s)
        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(self._keys.worker_heartbeat(self.worker_id))

    async def _heartbeat(self) -> None:
        key = self._keys.worker_heartbeat(self.worker_id)
        while True:
            with contextlib.suppress(RedisError, OSError):
                await self._redis.set(key, ",".join(self._capacity), ex=int(_HEARTBEAT_S * 3))
            await asyncio.sleep(_HEARTBEAT_S)

    async def _consume(self, tier: str, slots: int) -> None:
        deployments = self._tiers.get(tier, [])
        slot_keys = self._pool.slot_keys(deployments)
        batch_limit = max(math.floor(slots * (1 - self._headroom)), 1) if slot_keys else -1
        local = asyncio.Semaphore(slots)
        backoff = 0.05
        reservation: Reservation | None = None
        have_local = False
        pause = _NO_SLOT_S[0]
        try:
            while True:
                try:
                    if deployments and reservation is None:
                        reservation = await self._pool.reserve(deployments)
                        if reservation is None:
                            await asyncio.sleep(pause)
                            pause = min(pause * 2, _NO_SLOT_S[1])
                            continue
                    elif not deployments and not have_local:
                        await local.acquire()
                        have_local = True
                    pause = _NO_SLOT_S[0]
                    taken = await self._lanes.take(
                        tier, self.worker_id, slot_keys=slot_keys, batch_limit=batch_limit
                    )
                    if taken is None:
                        await self._blocking.blpop([self._keys.bell(tier)], timeout=_BELL_S)
                        continue
                except (RedisError, OSError) as exc:
                    log.warning("worker cannot take from %s: %s", tier, type(exc).__name__)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                backoff = 0.05
                task = asyncio.create_task(
                    self._handle(taken, reservation, local if have_local else None)
                )
                reservation, have_local = None, False
                self._jobs.add(task)
                task.add_done_callback(self._jobs.discard)
        finally:
            if reservation is not None:
                await self._pool.release(reservation)
            if have_local:
                local.release()

    async def _handle(
        self, taken: Taken, reservation: Reservation | None, local: asyncio.Semaphore | None
    ) -> None:
        try:
            try:
                job = Job.decode(taken.job)
            except (KeyError, ValueError, TypeError) as exc:
                log.error("dropping malformed job %s: %s", taken.entry_id, exc)
                return
            if not await self._claim(job):
                return  # the edge gave up on it (deadline) and booked it
            started = time.time()
            if reservation is not None:
                async with self._pool.holding(reservation):
                    reservation = None
                    entry = await self._executor.run(job, self._emitter(job))
            else:
                entry = await self._executor.run(job, self._emitter(job))
            await self._ledger.write(entry)
            await self._note_service_time(taken.tier, time.time() - started)
        except Exception:
            log.exception("job %s failed in the worker", taken.entry_id)
        finally:
            if reservation is not None:
                await self._pool.release(reservation)
            if local is not None:
                local.release()
            with contextlib.suppress(RedisError, OSError):
                await self._lanes.ack(taken)

    async def _note_service_time(self, tier: str, seconds: float) -> None:
        """A moving average of backend time per job, published for expected-wait estimates."""
        old = self._service_s.get(tier)
        value = seconds if old is None else old + _SVC_ALPHA * (seconds - old)
        self._service_s[tier] = value
        with contextlib.suppress(RedisError, OSError):
            await self._redis.set(self._keys.service_time(tier), f"{value:.4f}", ex=3600)

    async def _claim(self, job: Job) -> bool:
        ttl = max(int(job.deadline - time.time()) + self._claim_ttl_s, self._claim_ttl_s)
        won = await self._redis.set(
            self._keys.claim(job.request_id), self.worker_id, nx=True, ex=ttl
        )
        return bool(won)

    def _emitter(self, job: Job) -> Emit:
        stream = self._keys.replies(job.reply_to)

        async def emit(reply: Reply) -> None:
            try:
                await self._redis.xadd(
                    stream, reply.fields(), maxlen=_REPLY_MAXLEN, approximate=True
                )
            except (RedisError, OSError) as exc:
                log.warning("cannot reply for %s: %s", job.request_id, type(exc).__name__)

        return emit
