"""The worker: take jobs from the tier streams, run them, send replies, book the ledger entry.

One ``Worker`` per process serves every tier. It reads a tier's stream only while it has a free
slot for that tier (the tier's replicas' ``max_num_seqs`` summed), so work beyond capacity waits
in Redis, not on the GPU servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from gateway.accounting.writer import LedgerWriter
from gateway.queue.executor import Emit, Executor
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.streams import stream_entries

__all__ = ["Worker"]

log = logging.getLogger(__name__)

_REPLY_MAXLEN = 100_000
_HEARTBEAT_S = 2.0


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
    ) -> None:
        self._redis = redis
        self._blocking = blocking_redis
        self._keys = keys
        self._executor = executor
        self._ledger = ledger
        self._capacity = {tier: n for tier, n in capacity.items() if n > 0}
        self.worker_id = worker_id
        self._claim_ttl_s = claim_ttl_s
        self._tasks: list[asyncio.Task[None]] = []
        self._jobs: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for tier, slots in self._capacity.items():
            self._tasks.append(
                asyncio.create_task(self._consume(tier, slots), name=f"tiergate-worker-{tier}")
            )
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="tiergate-heartbeat"))

    async def aclose(self, *, drain_s: float = 10.0) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
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

    async def _ensure_group(self, stream: str) -> None:
        try:
            await self._redis.xgroup_create(stream, self._keys.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _consume(self, tier: str, slots: int) -> None:
        stream = self._keys.jobs(tier)
        free = asyncio.Semaphore(slots)
        backoff = 0.05
        group_ready = False
        while True:
            await free.acquire()
            try:
                if not group_ready:
                    await self._ensure_group(stream)
                    group_ready = True
                response = await self._blocking.xreadgroup(
                    self._keys.group, self.worker_id, {stream: ">"}, count=1, block=1000
                )
            except (RedisError, OSError) as exc:
                free.release()
                group_ready = False
                log.warning("worker cannot read %s: %s", stream, type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            entries = stream_entries(response)
            if not entries:
                free.release()
                continue
            for entry_id, fields in entries:
                task = asyncio.create_task(self._handle(stream, entry_id, fields, free))
                self._jobs.add(task)
                task.add_done_callback(self._jobs.discard)

    async def _handle(
        self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], free: asyncio.Semaphore
    ) -> None:
        try:
            try:
                job = Job.decode(fields[b"j"])
            except (KeyError, ValueError, TypeError) as exc:
                log.error("dropping malformed job %s: %s", entry_id, exc)
                return
            if not await self._claim(job):
                return  # the edge gave up on it (deadline) and booked it
            entry = await self._executor.run(job, self._emitter(job))
            await self._ledger.write(entry)
        except Exception:
            log.exception("job %s failed in the worker", entry_id)
        finally:
            free.release()
            with contextlib.suppress(RedisError, OSError):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.xack(stream, self._keys.group, entry_id)
                    pipe.xdel(stream, entry_id)
                    await pipe.execute()

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
