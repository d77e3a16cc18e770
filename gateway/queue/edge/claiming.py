"""The edge's own claim on a job, and what the edge answers when it stops waiting for a run.

A worker takes a job's claim (``SET NX``) before it runs it; the edge takes it (``take``) when
it will wait no more: at the deadline of a job not known to have started
(``unstarted_at_deadline``), when a started stream is silent and its worker's heartbeat is gone
(``watch``), at the end of its drain (``stopped_waiting``), when the client leaves
(``Dispatcher.abandon``). Whoever wins books the request: the edge answers at once (a 504, a
503, a 502, booked final, or from the note of a run that handed the job back:
``gateway.queue.ownership.edge_booking``); a worker that holds the claim answers and books it,
and the edge's answer, if it gives one first, is booked *provisional*. A started job with no
answer by its deadline plus the grace gets ``late_started``'s 504. The states and transitions
are ``gateway.queue.ownership.table``'s.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    RunTimedOut,
    ServiceUnavailable,
    StreamCut,
    UpstreamFailed,
)
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.claims import EDGE_CLAIM, claim_ttl
from gateway.queue.ownership.notes import RunNote, parse_note
from gateway.queue.ownership.table import RUNNING_GRACE_S, EdgeTakeOver, OwnershipScripts

__all__ = [
    "SHUTTING_DOWN",
    "BooksNoNotes",
    "EdgeClaim",
    "EdgeClaims",
    "LocalCancel",
    "NotedBooker",
]

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the gateway is shutting down and could not finish the request in time"


@dataclass(frozen=True, slots=True)
class EdgeClaim:
    """What the edge's claim at the deadline (or when its client left) found."""

    edge: bool
    """The edge holds the job now: nothing will ever run it. Else a worker holds it: it runs
    it and books it."""
    note: RunNote | None = None
    """The calls a run noted before it handed the job back (the edge's claim only): the
    request's row books them. ``None``: no run made a call."""


class NotedBooker(Protocol):
    """Books a handed-back job the edge took over from its note
    (``gateway.queue.ownership.edge_booking``); the reply its client gets, or ``None`` when this
    edge books no notes."""

    async def book(
        self, job: Job, note: RunNote, answer: GatewayError, *, provisional: bool = False
    ) -> Reply | None: ...


class BooksNoNotes:
    """The ``NotedBooker`` of an edge that books no notes: the worker that finds a handed-back
    job books it (``Worker``), and the edge's 504 is provisional."""

    async def book(
        self, job: Job, note: RunNote, answer: GatewayError, *, provisional: bool = False
    ) -> None:
        return None


class LocalCancel(Protocol):
    """Stops a job this process's worker runs (``Worker.cancel``)."""

    def cancel(self, request_id: str) -> bool: ...


class EdgeClaims:
    """The edge's side of a job's claim: ``take`` it, and answer in the worker's place."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        *,
        claim_ttl_s: int,
        noted: NotedBooker,
        local: LocalCancel | None,
    ) -> None:
        """``noted``: books a handed-back job whose claim the edge takes, from its note;
        ``local``: this process's worker (``None``: none)."""
        self._redis = redis
        self._keys = keys
        self._claim_ttl_s = claim_ttl_s
        self._noted = noted
        self._local = local
        self._scripts = OwnershipScripts(redis)

    async def take(self, job: Job) -> EdgeClaim:
        """Take the job's claim for the edge (``SET NX``), and, in the same round trip, read
        the note a run left of its calls: a job handed back at shutdown has no claim but ran
        (``gateway.queue.ownership.notes``). The note is in another slot than the claim, so it is
        read beside the script-free ``SET``, not inside it; a run writes its note before it releases
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
            return EdgeClaim(edge=False)
        return EdgeClaim(edge=True, note=parse_note(raw, job.request_id))

    async def _take_at_deadline(self, job: Job) -> EdgeClaim:
        """``take`` for a job whose deadline passed, tried again while Redis fails
        (backing off) until the deadline plus the grace a started job gets: a job is never
        answered while it may still start. Redis still failing then: ``RunTimedOut``, booked
        provisional (a worker that takes it now answers and books 504 without a call)."""
        give_up_at = job.deadline + RUNNING_GRACE_S
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(ServiceUnavailable),
                stop=lambda _state: time.time() >= give_up_at,
                wait=wait_exponential(multiplier=0.05, max=1.0),
                reraise=True,
            ):
                with attempt:
                    return await self.take(job)
        except ServiceUnavailable:
            pass
        raise RunTimedOut("the request's deadline passed while the queue could not be reached")

    async def stopped_waiting(self, job: Job, *, delivered: bool, here: bool) -> Reply:
        """Answer ``job`` 503 ``shutting_down`` (after chunks: ``StreamCut``): a job no worker
        holds is the edge's (booked final); one a worker holds (or this process's worker runs)
        is booked provisional, then its worker is told to stop: its entry, booked after this
        row, replaces the row's bookkeeping, and the row keeps what the client got. ``here``:
        this process's worker started it at once (it has no claim key)."""
        answer: GatewayError = (
            StreamCut(SHUTTING_DOWN)
            if delivered
            else ServiceUnavailable(SHUTTING_DOWN, code="shutting_down")
        )
        if not here:
            try:
                claim = await self.take(job)
            except ServiceUnavailable:
                raise answer.unsettled() from None
            if claim.edge:
                if claim.note is None and not delivered:
                    raise answer  # it never ran: the handler books the 503, final
                booked = await self._noted.book(job, claim.note or RunNote(()), answer)
                if booked is None:
                    raise answer.unsettled()
                return booked
        booked = await self._noted.book(job, RunNote(()), answer, provisional=True)
        if booked is None:
            raise answer.unsettled()  # no booker here: left running, the row provisional
        if here and self._local is not None:
            self._local.cancel(job.request_id)
        else:
            with contextlib.suppress(RedisError, OSError):  # else it runs on, booked the same
                await self._redis.publish(self._keys.cancels, job.request_id)
        return booked

    async def unstarted_at_deadline(self, job: Job) -> Reply | None:
        """A job not known to have started, at its deadline: the edge's claim. ``None``: a
        worker holds it (it started); else the edge answers it (a 504, or, handed back with
        calls noted, booked from the note)."""
        claim = await self._take_at_deadline(job)
        if not claim.edge:
            return None
        if claim.note is None:
            raise DeadlineExceeded("the request could not start before its deadline")
        return await self._handed_back_late(job, claim.note)

    async def watch(self, job: Job, *, delivered: bool, here: bool) -> Reply | None:
        """A stream silent for ``watch_s``: if the worker that holds its claim is gone (its
        heartbeat expired), the edge takes the claim (``gateway.queue.ownership.table``: no run will
        start it again) and ends the request now rather than at its deadline — an error
        event after the chunks already sent (booked ``stream_error``), else a 502 — booked
        here with the calls its runs noted. ``None``: keep waiting (its worker lives, or it
        has not started, or Redis did not answer; or this process's worker runs it)."""
        if here:
            return None
        tier = job.plan.tier.value
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                await self._scripts.edge_take_over(
                    self._keys.claim(tier, job.request_id),
                    heartbeat_prefix=self._keys.tier_heartbeat(tier, ""),
                    ttl_s=claim_ttl(job, self._claim_ttl_s),
                    pipe=pipe,
                )
                pipe.get(self._keys.run_note(job.request_id))
                verdict, raw = await pipe.execute()
        except (RedisError, OSError):
            return None
        if EdgeTakeOver(verdict.decode() if isinstance(verdict, bytes) else verdict) != (
            EdgeTakeOver.TAKEN
        ):
            return None
        log.warning("the worker running %s is gone: answered by the edge", job.request_id)
        lost = "the worker running the request stopped"
        note = parse_note(raw, job.request_id)
        answer: GatewayError = StreamCut(lost) if delivered else UpstreamFailed(lost)
        if note is None and not delivered:
            raise answer  # no call noted: booked as the edge's own answer
        booked = await self._noted.book(job, note or RunNote(()), answer)
        if booked is None:
            raise answer
        return booked

    async def late_started(self, job: Job, *, delivered: bool, here: bool) -> Reply:
        """A started job with no answer by its deadline plus the grace: ``RunTimedOut``
        (provisional: its run books it), unless its worker handed it back with its calls
        noted and no run took it over, so the edge's claim wins: then it is booked here from
        the note, final, and its client gets that 504 with the cost. A job this process
        started at once has no claim key and is never claimed.

        A stream under way (``delivered``) is answered with an error event after its chunks
        (``StreamCut``), and booked so here, provisional: its run's entry, which may come
        first or later (its answer lost on the way: a killed cluster master held the reply
        stream), joins the row keeping what the client got. Before, nothing was booked here
        and the row was the run's 200/ok."""
        timed_out = RunTimedOut("the backend did not finish before the deadline")
        claim = None
        if not here:
            with contextlib.suppress(ServiceUnavailable):
                claim = await self.take(job)
            if claim is not None and claim.edge and claim.note is not None:
                return await self._handed_back_late(job, claim.note)
        if not delivered:
            raise timed_out
        cut = StreamCut(timed_out.message)
        edge_holds = claim is not None and claim.edge  # no run will book it: final
        booked = await self._noted.book(job, RunNote(()), cut, provisional=not edge_holds)
        if booked is None:
            raise cut.unsettled()  # no booker here (an edge that books no notes)
        return booked

    async def _handed_back_late(self, job: Job, note: RunNote) -> Reply:
        """The edge's claim took a handed-back job past its deadline: booked from ``note``
        here, answered as a worker's error is (its 504 carries the cost); with no booker, left
        to the worker that finds the job (``RunTimedOut``: a provisional row)."""
        late = "the request was handed back and not taken over before its deadline"
        booked = await self._noted.book(job, note, DeadlineExceeded(late))
        if booked is None:
            raise RunTimedOut(late)
        return booked
