"""The edge's side of the queue: admit a job, queue it, and wait for its replies.

Ownership of a request's outcome is settled by one ``SET NX`` on its claim key: the worker sets
it before it starts a job; the edge sets it when the deadline passes first. Whoever wins writes
the ledger entry, so a request is never answered 504 *and* run, nor booked twice.

A job that had started (a worker holds its claim, or it was started at once or handed over)
and gave no answer by the deadline plus ``RUNNING_GRACE_S`` is answered 504 with
``RunTimedOut``: the edge books that 504 *provisional*, since a run may still book the request
(its worker died and another takes it over, or it simply finishes late), and the run's entry
then replaces the row's bookkeeping (``gateway.accounting.supersede``). A job that never started
is answered with a plain ``DeadlineExceeded``, booked final.

A job a run handed back at shutdown has no claim, but its calls are noted
(``gateway.queue.ownership.notes``). When the edge takes its claim — the deadline passed, or the
client left — it reads the note in the same round trip, and books the request itself from it
(``gateway.queue.ownership.edge_booking``): no run can start once the edge holds the claim, so
nothing is left for a worker to add, and nothing waits for one.

When the process also runs a worker (``local``), a job that would be taken at once is started
by it directly (``Worker.start_now``): no wait in a stream, no reply stream, and no edge claim
(its deadline is held by the backend timeouts, as for any started job). Otherwise such a job is
handed to an idle worker of any process by the enqueue script, which takes the claim for it
(``gateway.queue.lanes``): the edge then waits for it as for a started job.

A job that must queue and is not expected to start before its deadline is refused at once with
429 ``deadline_unreachable`` (``gateway.queue.edge.deadline``), rather than answered 504 after
waiting for it.

When the edge shuts down, ``stop_waiting`` (at the end of its drain) answers every request
still waiting: 503 ``shutting_down`` (an error event after a stream's chunks). A job no worker
holds is claimed by the edge (booked final, or from its note); one a worker runs is booked
*provisional* before its worker is told to stop, so the run's entry replaces the row's
bookkeeping while the row keeps the 503 the client got.

The edge's claim, and each answer it gives in a worker's place, are
``gateway.queue.edge.claiming`` (``EdgeClaims``); this module queues and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import (
    ClientDisconnected,
    GatewayError,
    RateLimited,
    ServiceUnavailable,
)
from gateway.limits.idempotency import Idempotency, request_fingerprint
from gateway.queue.edge.claiming import BooksNoNotes, EdgeClaims, NotedBooker
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.jobs import Job, Reply, reply_kind
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import HANDED_OFF, Handoff, LaneQueue, QueueFull, lane_of
from gateway.queue.ownership.claims import EDGE_CLAIM, claim_ttl
from gateway.queue.ownership.table import RUNNING_GRACE_S

log = logging.getLogger(__name__)

__all__ = ["EDGE_CLAIM", "Dispatcher", "LocalStart"]


class StartAdmission(Protocol):
    """Refuses at once a job that cannot start before its deadline (``DeadlineAdmission``)."""

    def check(
        self, *, tier: str, lane: str, tenant: str, weight: float, time_left_s: float
    ) -> None: ...


class AdmitsEveryStart:
    """The ``StartAdmission`` that refuses nothing (``queue.deadline_admission`` off)."""

    def check(
        self, *, tier: str, lane: str, tenant: str, weight: float, time_left_s: float
    ) -> None:
        return None


def _one_second(tier: str) -> float:
    return 1.0


class LocalStart(Protocol):
    """A worker in this process that may start a job at once (``Worker.start_now``)."""

    async def start_now(self, job: Job, deliver: Callable[[Reply], None]) -> bool: ...

    def cancel(self, request_id: str) -> bool: ...


class _StopWaiting(Exception):
    """Put in a waiting request's reply queue when the edge stops waiting (``stop_waiting``)."""


class Dispatcher:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        replies: ReplyRouter,
        *,
        max_depth: int,
        claim_ttl_s: int,
        tier_max_depth: Mapping[str, int] | None = None,
        weights: Mapping[str, float] | None = None,
        expected_wait: Callable[[str], float] = _one_second,
        idempotency: Idempotency | None = None,
        local: LocalStart | None = None,
        deadline: StartAdmission | None = None,
        noted: NotedBooker | None = None,
        watch_s: float | None = 2.0,
    ) -> None:
        """``tier_max_depth`` overrides ``max_depth`` per tier; ``weights`` are tenants' fair
        shares (default 1), read at each submit (a live view: ``TenantDirectory.weights``);
        ``expected_wait(tier)`` (s) sets a refusal's ``Retry-After``; ``local``: this process's
        worker, which starts jobs at once when they need not wait; ``deadline``: refuse at once
        a job that is not expected to start before its deadline (default: ``AdmitsEveryStart``);
        ``noted``: books a handed-back job whose claim the edge takes, from its note (default:
        ``BooksNoNotes``, the worker that finds the job books it); ``watch_s``: how long
        a stream may be silent before its worker's heartbeat is checked (``None``: never)."""
        self._redis = redis
        self._keys = keys
        self._replies = replies
        self._max_depth = max_depth
        self._tier_max_depth = dict(tier_max_depth or {})
        self._weights: Mapping[str, float] = weights if weights is not None else {}
        self._expected_wait = expected_wait
        self._claim_ttl_s = claim_ttl_s
        self._lanes = LaneQueue(redis, keys)
        self._idempotency = idempotency
        self._local = local
        self._deadline: StartAdmission = deadline or AdmitsEveryStart()
        self._noted: NotedBooker = noted or BooksNoNotes()
        self._claims = EdgeClaims(
            redis, keys, claim_ttl_s=claim_ttl_s, noted=self._noted, local=local
        )
        self._watch_s = watch_s
        self._abandoning: set[asyncio.Task[None]] = set()
        self._started_here: set[str] = set()
        """Jobs this process's worker started at once (no claim key: the worker owns them)."""
        self._waiting: dict[str, asyncio.Queue[Reply | BaseException]] = {}
        """Request id -> the queue its replies arrive in, while its client waits."""
        self._stopped = False

    async def submit(self, job: Job) -> AsyncIterator[Reply]:
        """Queue ``job`` and return its replies, in order. Raises ``RateLimited`` when the tier's
        queue is full or the job cannot start before its deadline, and ``ServiceUnavailable``
        when Redis cannot be used."""
        idempotency, key = self._idempotency, job.idempotency_key
        if idempotency is None or not key or job.stream:
            return await self._submit(job)
        fingerprint = request_fingerprint(job)
        try:
            first = await idempotency.claim(job.tenant, key, job.request_id, fingerprint)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
        if first is not None:
            return self._replay(job, key)
        try:
            return await self._submit(job)
        except BaseException:
            # Refused before it could run: the key is free for a retry.
            with contextlib.suppress(RedisError, OSError):
                await idempotency.release(job.tenant, key, job.request_id, fingerprint)
            raise

    async def _submit(self, job: Job) -> AsyncIterator[Reply]:
        if self._local is not None:
            local: asyncio.Queue[Reply | BaseException] = asyncio.Queue()
            try:
                if await self._local.start_now(job, local.put_nowait):
                    self._started_here.add(job.request_id)
                    return self._replies_of(job, local, started=True)
            except (RedisError, OSError) as exc:
                raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
        tier = job.plan.tier.value
        weight = self.weight(job.tenant)
        self._deadline.check(
            tier=tier,
            lane=lane_of(job.priority),
            tenant=job.tenant,
            weight=weight,
            time_left_s=job.deadline - time.time(),
        )
        queue = self._replies.register(job.request_id)
        try:
            depth = await self._lanes.enqueue(
                tier=tier,
                lane=lane_of(job.priority),
                tenant=job.tenant,
                job=job.encode(),
                weight=weight,
                max_depth=self._tier_max_depth.get(tier, self._max_depth),
                handoff=Handoff(job.request_id, claim_ttl(job, self._claim_ttl_s)),
            )
        except QueueFull as full:
            self._replies.unregister(job.request_id)
            raise RateLimited(
                f"the {tier} tier's queue is full ({full.depth} waiting)",
                code="queue_full",
                retry_after=self._retry_after(tier),
            ) from None
        except (RedisError, OSError) as exc:
            unavailable = ServiceUnavailable(f"queue unavailable: {type(exc).__name__}")
            return await self._enqueue_failed(job, queue, unavailable)
        except BaseException:
            self._replies.unregister(job.request_id)
            raise
        return self._replies_of(job, queue, started=depth == HANDED_OFF)

    async def _enqueue_failed(
        self, job: Job, queue: asyncio.Queue[Reply | BaseException], unavailable: GatewayError
    ) -> AsyncIterator[Reply]:
        """The enqueue failed, perhaps after Redis ran it (the reply was lost): the job may be
        queued, or handed to a worker. The edge takes its claim, so that it never runs, and
        answers 503 (final); a worker holds it: its answer is waited for, as for any started
        job. Redis not answering that either: 503, booked provisional (a run that books the
        request later replaces the row's bookkeeping, the row keeps the 503)."""
        try:
            claim = await self._claims.take(job)
        except ServiceUnavailable:
            self._replies.unregister(job.request_id)
            raise unavailable.unsettled() from None
        if claim.edge:
            self._replies.unregister(job.request_id)
            raise unavailable
        return self._replies_of(job, queue, started=True)

    async def _replies_of(
        self, job: Job, queue: asyncio.Queue[Reply | BaseException], *, started: bool = False
    ) -> AsyncIterator[Reply]:
        """``started``: a worker runs the job (this process's, or an idle one it was handed to):
        nothing to claim at the deadline. A stream silent for ``watch_s`` has its worker
        checked (``EdgeClaims.watch``), unless this process's worker runs it."""
        deadline = job.deadline + (RUNNING_GRACE_S if started else 0.0)
        claims = self._claims
        claimed_by_worker = started
        watched = job.stream and self._watch_s is not None
        delivered = False
        self._wait_for(job.request_id, queue)
        try:
            while True:
                now = time.time()
                # Near its deadline a silent stream is left to the deadline's own answer.
                near = self._watch_s is None or job.deadline - now <= self._watch_s
                watch_at = (
                    now + self._watch_s if watched and not near and self._watch_s else math.inf
                )
                item = await _next_or_none(queue, min(deadline, watch_at))
                if item is None:
                    if watch_at < deadline:  # the watch's timer fired, not the deadline's
                        found = await claims.watch(job, delivered=delivered, here=self._here(job))
                    elif time.time() < deadline:
                        # The loop's clock woke a little before the wall clock's deadline:
                        # a job is never answered before it.
                        continue
                    elif claimed_by_worker:
                        found = await claims.late_started(
                            job, delivered=delivered, here=self._here(job)
                        )
                    else:
                        found = await claims.unstarted_at_deadline(job)
                        if found is None:  # a worker holds it: wait for it
                            claimed_by_worker = True
                            deadline = job.deadline + RUNNING_GRACE_S
                    if found is None:
                        continue
                    item = found
                if isinstance(item, _StopWaiting):
                    item = await claims.stopped_waiting(
                        job, delivered=delivered, here=self._here(job)
                    )
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.kind in ("result", "error", "end"):
                    return
                delivered = True
        finally:
            self._waiting.pop(job.request_id, None)
            self._replies.unregister(job.request_id)
            self._started_here.discard(job.request_id)

    def _here(self, job: Job) -> bool:
        """Whether this process's worker started ``job`` at once (it has no claim key)."""
        return job.request_id in self._started_here

    def _wait_for(self, request_id: str, queue: asyncio.Queue[Reply | BaseException]) -> None:
        self._waiting[request_id] = queue
        if self._stopped:  # came in after the drain's end: answered at once
            queue.put_nowait(_StopWaiting())

    def stop_waiting(self) -> int:
        """The edge's drain is over: every request still waiting is answered now (and any
        that comes after at once), as ``EdgeClaims.stopped_waiting`` says. How many were waiting."""
        self._stopped = True
        for queue in self._waiting.values():
            queue.put_nowait(_StopWaiting())
        return len(self._waiting)

    def weight(self, tenant: str) -> float:
        """``tenant``'s fair share in its lane (default 1)."""
        return self._weights.get(tenant, 1.0)

    async def abandon(self, job: Job) -> bool:
        """The client of ``job`` went away. ``True``: the job had not started and never will
        (the edge took its claim; the caller books it). ``False``: it is booked elsewhere — by
        the worker that runs it, told to stop (directly, or on the cancel channel), or here: a
        job handed back with its calls noted, whose claim the edge took, is booked from its
        note (``gateway.queue.ownership.edge_booking``)."""
        if self._local is not None and (
            self._local.cancel(job.request_id) or job.request_id in self._started_here
        ):
            # It runs in this process (started at once, or taken here), or it was started at
            # once and has just finished: either way its worker books it. A job started at
            # once has no claim key, so the edge's claim below would win and book it twice.
            return False
        gone = ClientDisconnected("the client closed the connection before the answer")
        try:
            claim = await self._claims.take(job)
        except ServiceUnavailable:
            # Who owns it is unknown: a provisional 499, replaced by a run's bookkeeping.
            raise gone.unsettled() from None
        if claim.edge:
            if claim.note is None:
                return True  # it never ran: a plain refusal
            await self._noted.book(job, claim.note, gone)  # no booker: the worker that finds it
            return False
        try:
            await self._redis.publish(self._keys.cancels, job.request_id)
        except (RedisError, OSError) as exc:
            # Its worker runs it to the end and books it: the cancel only saved tokens.
            log.warning("cannot cancel %s: %s", job.request_id, type(exc).__name__)
        return False

    def abandon_soon(self, job: Job, book_unrun: Callable[[], Awaitable[None]]) -> None:
        """``abandon`` from a context that is being cancelled (a stream whose client left);
        ``book_unrun`` books the request when ``abandon`` leaves it to the caller: a stream
        handed back mid-way whose run note could not be written is found with no note."""

        async def abandon() -> None:
            if await self.abandon(job):
                await book_unrun()

        task = asyncio.create_task(abandon(), name=f"tiergate-abandon-{job.request_id}")
        self._abandoning.add(task)
        task.add_done_callback(self._abandoned)

    def _abandoned(self, task: asyncio.Task[None]) -> None:
        self._abandoning.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not stop an abandoned job: %r", task.exception())

    async def _replay(self, job: Job, key: str) -> AsyncIterator[Reply]:
        """A repeat's answer: the first request's final reply (never queued, never booked); a
        refusal (the first's answer was lost with Redis: 409) is booked by the edge."""
        assert self._idempotency is not None
        try:
            reply = await self._idempotency.wait(job.tenant, key, job.deadline)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
        kind = reply_kind(reply.kind)
        yield Reply(job.request_id, kind, reply.data, replace(reply.meta, replayed=True))

    def _retry_after(self, tier: str) -> float:
        """Whole seconds until the queue is expected to have room: its expected wait, 1-60."""
        wait = self._expected_wait(tier)
        return float(min(max(math.ceil(wait), 1), 60))


async def _next_or_none(
    queue: asyncio.Queue[Reply | BaseException], wake_at: float
) -> Reply | BaseException | None:
    """The next item of ``queue``, or ``None`` once the wall clock's ``wake_at`` is reached (the
    loop's timer may fire a little before it: the caller checks the wall clock)."""
    if not queue.empty():
        return queue.get_nowait()
    timeout = wake_at - time.time()
    if timeout <= 0:
        return None
    try:
        async with asyncio.timeout(timeout):
            return await queue.get()  # no task per reply (wait_for)
    except TimeoutError:
        return None
