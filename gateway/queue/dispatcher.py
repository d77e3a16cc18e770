"""The edge's side of the queue: admit a job, queue it, and wait for its replies.

Ownership of a request's outcome is settled by one ``SET NX`` on its claim key: the worker sets
it before it starts a job; the edge sets it when the deadline passes first. Whoever wins writes
the ledger entry, so a request is never answered 504 *and* run, nor booked twice.

A job that had started (a worker holds its claim, or it was started at once or handed over)
and gave no answer by the deadline plus ``_RUNNING_GRACE_S`` is answered 504 with
``RunTimedOut``: the edge books that 504 *provisional*, since a run may still book the request
(its worker died and another takes it over, or it simply finishes late), and the run's entry
then replaces the row's bookkeeping (``gateway.accounting.supersede``). A job that never started
is answered with a plain ``DeadlineExceeded``, booked final.

A job a run handed back at shutdown has no claim, but its calls are noted
(``gateway.queue.notes``). When the edge takes its claim — the deadline passed, or the client
left — it reads the note in the same round trip, and books the request itself from it
(``gateway.queue.noted``): no run can start once the edge holds the claim, so nothing is left
for a worker to add, and nothing waits for one.

When the process also runs a worker (``local``), a job that would be taken at once is started
by it directly (``Worker.start_now``): no wait in a stream, no reply stream, and no edge claim
(its deadline is held by the backend timeouts, as for any started job). Otherwise such a job is
handed to an idle worker of any process by the enqueue script, which takes the claim for it
(``gateway.queue.lanes``): the edge then waits for it as for a started job.

A job that must queue and is not expected to start before its deadline is refused at once with
429 ``deadline_unreachable`` (``gateway.queue.deadline``), rather than answered 504 after
waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import (
    ClientDisconnected,
    DeadlineExceeded,
    GatewayError,
    RateLimited,
    RunTimedOut,
    ServiceUnavailable,
)
from gateway.limits.idempotency import Idempotency
from gateway.queue.claims import EDGE_CLAIM, claim_ttl
from gateway.queue.deadline import DeadlineAdmission
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import HANDED_OFF, Handoff, LaneQueue, QueueFull, lane_of
from gateway.queue.notes import RunNote, parse_note
from gateway.queue.replies import ReplyRouter

log = logging.getLogger(__name__)

__all__ = ["EDGE_CLAIM", "Dispatcher", "LocalStart", "NotedBooker"]

_RUNNING_GRACE_S = 5.0
"""How long past its deadline the edge still waits for a job a worker has started: the worker's
backend timeouts end it at the deadline, so this only covers a worker that died mid-job (or is
late); the 504 the edge answers then is booked provisional (``RunTimedOut``)."""


@dataclass(frozen=True, slots=True)
class _Claim:
    """What the edge's claim at the deadline (or when its client left) found."""

    edge: bool
    """The edge holds the job now: nothing will ever run it. Else a worker holds it: it runs
    it and books it."""
    note: RunNote | None = None
    """The calls a run noted before it handed the job back (the edge's claim only): the
    request's row books them. ``None``: no run made a call."""


class NotedBooker(Protocol):
    """Books a handed-back job the edge took over from its note (``gateway.queue.noted``)."""

    async def book(self, job: Job, note: RunNote, answer: GatewayError) -> Reply: ...


class LocalStart(Protocol):
    """A worker in this process that may start a job at once (``Worker.start_now``)."""

    async def start_now(self, job: Job, deliver: Callable[[Reply], None]) -> bool: ...

    def cancel(self, request_id: str) -> bool: ...


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
        expected_wait: Callable[[str], float] | None = None,
        idempotency: Idempotency | None = None,
        local: LocalStart | None = None,
        deadline: DeadlineAdmission | None = None,
        noted: NotedBooker | None = None,
    ) -> None:
        """``tier_max_depth`` overrides ``max_depth`` per tier; ``weights`` are tenants' fair
        shares (default 1), read at each submit (a live view: ``TenantDirectory.weights``);
        ``expected_wait(tier)`` (s) sets a refusal's ``Retry-After``; ``local``: this process's
        worker, which starts jobs at once when they need not wait; ``deadline``: refuse at once
        a job that is not expected to start before its deadline (``None``: never); ``noted``:
        books a handed-back job whose claim the edge takes, from its note (``None``, in tests:
        left to the worker that finds the job, and a 504 is provisional)."""
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
        self._deadline = deadline
        self._noted = noted
        self._abandoning: set[asyncio.Task[None]] = set()
        self._started_here: set[str] = set()
        """Jobs this process's worker started at once (no claim key: the worker owns them)."""

    async def submit(self, job: Job) -> AsyncIterator[Reply]:
        """Queue ``job`` and return its replies, in order. Raises ``RateLimited`` when the tier's
        queue is full or the job cannot start before its deadline, and ``ServiceUnavailable``
        when Redis cannot be used."""
        idempotency, key = self._idempotency, job.idempotency_key
        if idempotency is None or not key or job.stream:
            return await self._submit(job)
        try:
            first = await idempotency.claim(job.tenant, key, job.request_id)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
        if first is not None:
            return self._replay(job, key)
        try:
            return await self._submit(job)
        except BaseException:
            # Refused before it could run: the key is free for a retry.
            with contextlib.suppress(RedisError, OSError):
                await idempotency.release(job.tenant, key, job.request_id)
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
        if self._deadline is not None:
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
            self._replies.unregister(job.request_id)
            raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
        except BaseException:
            self._replies.unregister(job.request_id)
            raise
        return self._replies_of(job, queue, started=depth == HANDED_OFF)

    async def _replies_of(
        self, job: Job, queue: asyncio.Queue[Reply | BaseException], *, started: bool = False
    ) -> AsyncIterator[Reply]:
        """``started``: a worker runs the job (this process's, or an idle one it was handed to):
        nothing to claim at the deadline."""
        deadline = job.deadline + (_RUNNING_GRACE_S if started else 0.0)
        claimed_by_worker = started
        try:
            while True:
                timeout = deadline - time.time()
                try:
                    if not queue.empty():
                        item = queue.get_nowait()
                    elif timeout <= 0:
                        raise TimeoutError
                    else:
                        async with asyncio.timeout(timeout):  # no task per reply (wait_for)
                            item = await queue.get()
                except TimeoutError:
                    if claimed_by_worker:
                        item = await self._late_started(job)
                    else:
                        claim = await self._claim_for_edge(job)
                        if not claim.edge:
                            claimed_by_worker = True
                            deadline = job.deadline + _RUNNING_GRACE_S
                            continue
                        if claim.note is None:
                            raise DeadlineExceeded(
                                "the request could not start before its deadline"
                            ) from None
                        item = await self._handed_back_late(job, claim.note)
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.kind in ("result", "error", "end"):
                    return
        finally:
            self._replies.unregister(job.request_id)
            self._started_here.discard(job.request_id)

    def weight(self, tenant: str) -> float:
        """``tenant``'s fair share in its lane (default 1)."""
        return self._weights.get(tenant, 1.0)

    async def abandon(self, job: Job) -> bool:
        """The client of ``job`` went away. ``True``: the job had not started and never will
        (the edge took its claim; the caller books it). ``False``: it is booked elsewhere — by
        the worker that runs it, told to stop (directly, or on the cancel channel), or here: a
        job handed back with its calls noted, whose claim the edge took, is booked from its
        note (``gateway.queue.noted``)."""
        if self._local is not None and (
            self._local.cancel(job.request_id) or job.request_id in self._started_here
        ):
            # It runs in this process (started at once, or taken here), or it was started at
            # once and has just finished: either way its worker books it. A job started at
            # once has no claim key, so the edge's claim below would win and book it twice.
            return False
        claim = await self._claim_for_edge(job)
        if claim.edge:
            if claim.note is None:
                return True  # it never ran: a plain refusal
            gone = ClientDisconnected("the client closed the connection before the answer")
            await self._book_noted(job, claim.note, gone)  # no booker: the worker that finds it
            return False
        try:
            await self._redis.publish(self._keys.cancels, job.request_id)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
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
        yield Reply(job.request_id, reply.kind, reply.data, {**reply.meta, "replayed": True})

    def _retry_after(self, tier: str) -> float:
        """Whole seconds until the queue is expected to have room: its expected wait, 1-60."""
        wait = self._expected_wait(tier) if self._expected_wait is not None else 1.0
        return float(min(max(math.ceil(wait), 1), 60))

    async def _claim_for_edge(self, job: Job) -> _Claim:
        """Take the job's claim for the edge (``SET NX``), and, in the same round trip, read
        the note a run left of its calls: a job handed back at shutdown has no claim but ran
        (``gateway.queue.notes``). The note is in another slot than the claim, so it is read
        beside the script-free ``SET``, not inside it; a run writes its note before it releases
        the claim, and once the edge holds the claim no run can start, so the note read is the
        last one."""
        claim = self._keys.claim(job.plan.tier.value, job.request_id)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(claim, EDGE_CLAIM, nx=True, ex=claim_ttl(job, self._claim_ttl_s))
                pipe.get(self._keys.run_note(job.request_id))
                won, raw = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"queue unavailable: {type(exc).__name__}") from exc
        if not won:
            return _Claim(edge=False)
        return _Claim(edge=True, note=parse_note(raw, job.request_id))

    async def _late_started(self, job: Job) -> Reply:
        """A started job with no answer by its deadline plus the grace: ``RunTimedOut``
        (provisional: its run books it), unless its worker handed it back with its calls
        noted and no run took it over, so the edge's claim wins: then it is booked here from
        the note, final, and its client gets that 504 with the cost. A job this process
        started at once has no claim key and is never claimed."""
        timed_out = RunTimedOut("the backend did not finish before the deadline")
        if job.request_id in self._started_here:
            raise timed_out
        try:
            claim = await self._claim_for_edge(job)
        except ServiceUnavailable:
            raise timed_out from None
        if not claim.edge or claim.note is None:
            raise timed_out
        return await self._handed_back_late(job, claim.note)

    async def _handed_back_late(self, job: Job, note: RunNote) -> Reply:
        """The edge's claim took a handed-back job past its deadline: booked from ``note``
        here, answered as a worker's error is (its 504 carries the cost); with no booker, left
        to the worker that finds the job (``RunTimedOut``: a provisional row)."""
        late = "the request was handed back and not taken over before its deadline"
        booked = await self._book_noted(job, note, DeadlineExceeded(late))
        if booked is None:
            raise RunTimedOut(late)
        return booked

    async def _book_noted(self, job: Job, note: RunNote, answer: GatewayError) -> Reply | None:
        """Book a handed-back job the edge took over, answered ``answer``, from its note; the
        reply its client gets. ``None``: this edge books no notes (the worker that finds the
        job books them: ``Worker``)."""
        if self._noted is None:
            return None
        return await self._noted.book(job, note, answer)
