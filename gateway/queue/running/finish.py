"""A job's end in the worker: book, acknowledge, answer, in that order.

The run's final reply is held back until its row is booked and its entry acknowledged
(``Finisher.finish``): a worker that dies before that has answered nothing, and the job runs
again; one that dies after has booked what its client gets, and is never run again. With the
answer going through the reply stream, the three go out in one pipeline (the ledger event, the
finish script of ``gateway.queue.ownership.table``, the reply); an answer handed over in memory
follows right after. Redis failing: tried again (tenacity) until the job's edge stopped waiting,
then the row goes to SQL (``docs/queue.md``, "A job's end").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from tenacity import retry_if_exception_type, wait_exponential

from gateway.accounting.records import LedgerEntry
from gateway.coalescer import CommandQueue
from gateway.errors import UpstreamFailed
from gateway.queue.jobs import Job, Reply
from gateway.queue.lanes import LaneQueue, Taken
from gateway.queue.ownership.claims import WorkerClaims
from gateway.queue.ownership.table import RUNNING_GRACE_S
from gateway.queue.running.replying import Deliver, ReplySender
from gateway.retrying import again

__all__ = ["EntryWriter", "Finisher"]

log = logging.getLogger(__name__)

_FINISH_MARGIN_S = 2.0
"""How long after its edge stopped waiting (deadline plus grace) a worker still tries to book
a finished job through Redis before it books it in SQL."""


class EntryWriter(Protocol):
    """Books a job's ledger entry (``LedgerWriter``)."""

    async def write(
        self,
        entry: LedgerEntry,
        *,
        then: Callable[[], None] | None = None,
        sql_fallback: bool = True,
    ) -> None: ...


@dataclass(slots=True)
class _Finishing:
    """A job's end as ``Finisher.finish`` goes through it: what it books and answers, and how
    far it got."""

    taken: Taken
    job: Job
    entry: LedgerEntry
    answer: Reply | None
    booked: bool = False
    acked: bool = False
    answered: bool = False


class Finisher:
    """Ends the worker's jobs: ``finish`` a run (book, acknowledge, answer), ``book`` a row
    with its acknowledgement queued behind it, ``replies_lost`` to close a stream Redis cut."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        ledger: EntryWriter,
        claims: WorkerClaims,
        replies: ReplySender,
        lanes: LaneQueue,
        coalescer: CommandQueue,
    ) -> None:
        self._redis = redis
        self._ledger = ledger
        self._claims = claims
        self._replies = replies
        self._lanes = lanes
        self._coalescer = coalescer

    def replies_lost(
        self, job: Job, entry: LedgerEntry, answer: Reply | None
    ) -> tuple[LedgerEntry, Reply | None]:
        """A stream a chunk of which could not be sent (Redis failed under it) ends with an
        error, never with a hole: after chunks its client had, an error event (booked
        ``stream_error``, status 200); before any, a 502 (booked so). Either row books every
        token the backend served."""
        some_sent = self._replies.lost(job.request_id)
        if some_sent is None or answer is None:
            return entry, answer
        failure = UpstreamFailed("part of the stream could not be delivered (the queue failed)")
        if some_sent:
            row = dataclasses.replace(entry, outcome="stream_error", status_code=200)
        else:
            row = dataclasses.replace(entry, outcome=failure.outcome, status_code=failure.status)
        return row, Reply.failed(job.request_id, failure, answer.meta)

    async def finish(
        self,
        taken: Taken,
        job: Job,
        entry: LedgerEntry,
        answer: Reply | None,
        send: Callable[[Reply], Awaitable[None]],
        deliver: Deliver | None,
    ) -> bool:
        """Book, acknowledge, answer — in that order, one pipeline when the answer goes through
        the reply stream (the ledger event, the finish script of ``gateway.queue.ownership.table``,
        the reply), else the answer handed over in memory right after it. Redis runs a
        pipeline's commands in order, and a process killed after sending it has sent all of it:
        a worker's death at any point leaves either nothing (the job runs again, its client
        had no answer) or the row, the finished claim and the answer together.

        Redis failing: tried again until the edge has stopped waiting (its deadline plus its
        grace, and a margin), so the answer still follows its row when Redis comes back in
        time; after that the row goes to SQL, where it replaces the bookkeeping of the edge's
        provisional 504 (its client got that). Whether the entry is acknowledged."""
        if answer is not None:
            await self._replies.remember(job, answer)
        stream = self._replies.through_stream(job, deliver) if answer is not None else None
        done = _Finishing(taken, job, entry, answer)
        give_up_at = job.deadline + RUNNING_GRACE_S + _FINISH_MARGIN_S
        try:
            try:
                await self._once(done, stream)  # as a rule: no tenacity machinery
            except (RedisError, OSError) as failed:
                await again(
                    lambda: self._once(done, stream),
                    failed,
                    retry=retry_if_exception_type((RedisError, OSError)),
                    stop=lambda _state: time.time() >= give_up_at,
                    wait=wait_exponential(multiplier=0.05, max=1.0),
                )
        except (RedisError, OSError) as exc:
            log.warning(
                "job %s: queue unavailable at its end (%s); booked in SQL",
                job.request_id, type(exc).__name__,
            )  # fmt: skip
            await self._without_redis(done, send)
            return done.acked
        if answer is not None and stream is None:
            await send(answer)  # in memory (or its edge stopped waiting here: the stream)
        return done.acked

    async def _once(self, done: _Finishing, stream: str | None) -> None:
        """One try of ``finish``'s pipeline, for what is not done yet."""
        after: list[asyncio.Future[Any]] = []
        steps: list[Callable[[Pipeline], None]] = []
        taken, job, answer = done.taken, done.job, done.answer
        if not done.acked:
            steps.append(lambda pipe: self._claims.finish(pipe, taken, job))
        if stream is not None and answer is not None and not done.answered:
            steps.append(lambda pipe: self._replies.queue(pipe, stream, answer))

        def queue_behind() -> None:
            # One coalescer entry per command: it matches each entry to one reply.
            if not self._coalescer.closed:
                after.extend(self._coalescer.send(step) for step in steps)

        try:
            if not done.booked:
                await self._ledger.write(done.entry, then=queue_behind, sql_fallback=False)
                done.booked = True
            if after:
                for future in after:
                    await future
            elif steps:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for step in steps:
                        step(pipe)
                    await pipe.execute()
        finally:
            for future in after:
                if future.done() and not future.cancelled():
                    future.exception()  # retrieved: a failed pipeline is tried again
        done.acked = done.answered = True

    async def _without_redis(
        self, done: _Finishing, send: Callable[[Reply], Awaitable[None]]
    ) -> None:
        if not done.booked:
            try:
                await self._ledger.write(done.entry)  # to SQL, Redis being down
            except (RedisError, SQLAlchemyError, OSError):
                log.exception("job %s could not be booked anywhere", done.job.request_id)
        if done.answer is not None:
            with contextlib.suppress(RedisError, OSError):
                await send(done.answer)  # its edge has answered 504 by now: dropped there
        with contextlib.suppress(RedisError, OSError):
            async with self._redis.pipeline(transaction=False) as pipe:
                self._claims.finish(pipe, done.taken, done.job)
                await pipe.execute()
            done.acked = True

    async def book(self, taken: Taken, entry: LedgerEntry) -> bool:
        """Write the job's ledger entry; whether its acknowledgement went out with it (queued
        behind the event, in the same pipeline: never before it)."""
        acked = False

        def ack_behind_the_event() -> None:
            nonlocal acked
            acked = self._lanes.ack_later(taken)

        await self._ledger.write(entry, then=ack_behind_the_event)
        return acked
