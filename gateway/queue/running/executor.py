"""Runs one job: try the plan's deployments in order, relay the answer, account for every attempt.

For each deployment of the plan (the fallback chain):

1. skip it while its circuit breaker is open (``gateway.faults.breaker``; recorded as an attempt
   with outcome ``circuit_open``);
2. call it under the tier's retry policy (``gateway.faults.policy``): rate limits, 5xx and
   connect errors are retried on the same deployment with backoff or after ``Retry-After``;
   timeouts, cut streams and protocol errors move on at once; a rejected request stops the
   chain (context overflow moves on to a deployment whose window may fit);
3. every call is one ``Attempt`` in the ledger row, with the tokens that backend billed (for a
   stream that broke, the usage it reported so far: vLLM reports it in every chunk), and one
   outcome for the breaker. A call its provider bills without telling us (a hosted API's
   broken stream, which reports usage only at its end; a hosted call that timed out or was
   cancelled after it was sent; a hosted answer that arrived but could not be read) is booked
   from estimates, flagged (``gateway.accounting.estimates``).

Each call is held to the tier's per-attempt timeout and the request's deadline. A stream falls
back freely until its first token; after it, when continuation is allowed
(``gateway.faults.continuation``), the next vLLM deployment continues the delivered text and
the client sees one answer; otherwise the stream ends with an explicit error event. An answer
served by a lower tier than planned is flagged as a downgrade (``gateway.faults.chains``).

A job whose client went away is ``abandon``ed and its task cancelled: the backend call is
aborted (vLLM stops generating when its connection closes), and the job ends with outcome
``client_disconnected`` (499), billed for the tokens that reached us before (a hosted API's call:
estimated, as above). A job cancelled otherwise is being handed back at shutdown: its calls,
the interrupted one booked as cancelled, are noted for the worker that takes it over.

A job may run more than once (its worker died, or handed it back): each run notes its calls in
Redis where it leaves the common path (``gateway.queue.ownership.notes``), and a reclaimed run reads
the note first and books those calls in its own row, so the one row of the request has them all.

This module walks the chain (breakers, retry policy, deadline, continuation) and ends the run;
its parts live beside it: the run's record (``gateway.queue.run``), one backend call made and
booked (``gateway.queue.running.caller``), each call booked in the ledger row, a span, the attempts
metric and the breaker (``gateway.queue.running.attempts``), the relay of one streamed attempt's
chunks (``gateway.queue.running.stream_relay``), and the run's ledger entry and reply figures
(``gateway.queue.billing``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping

from backends.errors import BackendError, BackendRejected, ContextLengthExceeded
from backends.types import ChatResponse
from gateway.accounting.records import LedgerEntry
from gateway.errors import (
    ClientDisconnected,
    ContextTooLong,
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    RateLimited,
    UpstreamFailed,
)
from gateway.faults.breaker import RedisBreaker
from gateway.faults.chains import TierFaults
from gateway.faults.continuation import Delivered, can_continue, continuation_body
from gateway.faults.drain import InflightCalls
from gateway.faults.marks import StreamMarker
from gateway.faults.policy import Sleep
from gateway.observability.tracing import Tracing
from gateway.queue.billing import Billing, PriceLookup
from gateway.queue.jobs import Emit, Job, Reply
from gateway.queue.ownership.edge_booking import EDGE_BOOKING_GRACE_S
from gateway.queue.ownership.notes import CallNotes
from gateway.queue.replicas.pool import BackendPool
from gateway.queue.run import Run
from gateway.queue.running.attempts import Attempts
from gateway.queue.running.caller import Caller, MidStream, Tripped
from gateway.queue.running.stream_relay import StreamRelay
from router.catalog import Catalog, Tier

__all__ = ["Emit", "Executor", "PriceLookup"]


class Executor:
    """Serves jobs, one ``run`` each; ``abandon`` stops a job whose client went away."""

    def __init__(
        self,
        pool: BackendPool,
        prices: PriceLookup,
        catalog: Catalog,
        baselines: Mapping[str, str | None],
        *,
        breaker: RedisBreaker | None = None,
        faults: Mapping[Tier, TierFaults] | None = None,
        continuation: bool = True,
        sleep: Sleep = asyncio.sleep,
        stream_marks: StreamMarker,
        tracing: Tracing,
        inflight: InflightCalls,
        run_notes: CallNotes,
    ) -> None:
        """``breaker``: the deployments' circuit breakers (``None``: turned off in config,
        ``fallback.breaker``); ``stream_marks``: where a stream is marked started, for a run
        that takes its job over (``NoStreamMarks``: none is); ``run_notes``: where runs note
        their calls for a run that takes their job over (``NoRunNotes``: a job run again
        books only its last run's calls); ``inflight``: the calls in flight, which a replica
        found down drains; ``tracing``: ``Tracing.off()`` for none."""
        self._pool = pool
        self._catalog = catalog
        self._faults = dict(faults or {})
        self._continuation = continuation
        self._sleep = sleep
        self._marks = stream_marks
        self._tracing = tracing
        self._billing = Billing(prices, catalog, baselines)
        self._notes = run_notes
        self._attempts = Attempts(
            catalog,
            breaker=breaker,
            tracing=self._tracing,
            notes=run_notes,
            pool=pool,
        )
        self._abandoned: set[str] = set()
        self._caller = Caller(
            pool,
            self._billing,
            self._attempts,
            StreamRelay(self._billing, stream_marks, run_notes),
            tracing=self._tracing,
            inflight=inflight,
            abandoned=self._abandoned,
        )

    def abandon(self, request_id: str) -> None:
        """Mark a running job as abandoned by its client; cancel its task next."""
        self._abandoned.add(request_id)

    async def run(
        self, job: Job, emit: Emit, *, reclaimed: bool = False, local: bool = False
    ) -> LedgerEntry:
        """Serve ``job``; its ledger entry (not yet written). ``reclaimed``: taken over from a
        worker that died; ``local``: ``emit`` answers a client waiting in this process. Traced
        as ``queue.wait`` and ``job``, with one ``backend.attempt`` span per call."""
        with self._tracing.job(job) as span:
            entry = await self._guarded(Run(job, time.time(), reclaimed, local), emit)
            self._tracing.job_done(span, entry)
            return entry

    async def noted(self, job: Job) -> LedgerEntry | None:
        """The entry of a job whose claim the edge took after a run had handed it back, when
        the edge did not book it (``gateway.queue.ownership.edge_booking``: the edge books the noted
        calls and deletes the note, so a note still here means its process stopped in between): the
        calls that run noted (``None``: no note, nothing to book), under the answer the edge gave —
        a 504 past the deadline, else its client left — once the edge has had
        ``EDGE_BOOKING_GRACE_S`` to book it itself. Nothing is run or sent. The ledger keeps
        the request's first entry, so against the edge's row it changes nothing (it replaces
        the provisional 504 of an edge that books no notes: ``gateway.accounting.supersede``)."""
        if await self._notes.read(job.request_id) is None:
            return None
        # The edge that took the claim books the note within moments and deletes it; only it
        # knows what its client got (a 503 at shutdown is not a guess this run can make).
        await self._sleep(EDGE_BOOKING_GRACE_S)
        note = await self._notes.read(job.request_id)
        if note is None:
            return None  # the edge booked it
        answer: GatewayError = (
            DeadlineExceeded("the request was handed back and not taken over before its deadline")
            if time.time() >= job.deadline
            else ClientDisconnected("the client closed the connection")
        )
        entry, _meta = self._billing.noted(job, note, answer)
        return entry

    async def _guarded(self, run: Run, emit: Emit) -> LedgerEntry:
        """``_run``, ended as ``client_disconnected`` when the job is abandoned."""
        job = run.job
        try:
            return await self._run(run, emit)
        except asyncio.CancelledError:
            if job.request_id not in self._abandoned:
                # Shutting down: the worker hands the job back, its calls noted for the next.
                await self._attempts.handed_back(run)
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            gone = ClientDisconnected("the client closed the connection")
            return self._billing.entry(run, gone.outcome, gone.status)
        finally:
            self._abandoned.discard(job.request_id)

    async def _run(self, run: Run, emit: Emit) -> LedgerEntry:
        job = run.job
        if run.reclaimed:
            # Before anything else: however this run ends, its row books the earlier runs' calls.
            note = await self._notes.read(job.request_id)
            if note is not None:
                run.carried = note.booked(job.body, external=self._billing.external)
        if job.request_id in self._abandoned:  # its client left before it started
            gone = ClientDisconnected("the client closed the connection")
            return self._billing.entry(run, gone.outcome, gone.status)
        if run.picked_at >= job.deadline:
            error: GatewayError = DeadlineExceeded(
                "the request could not start before its deadline"
            )
            await emit(Reply.failed(job.request_id, error))
            return self._billing.entry(run, error.outcome, error.status)
        if job.stream and run.reclaimed and await self._marks.started(job.request_id):
            # A run before this one (its worker died) already sent part of the answer, which
            # this run cannot see: starting over would repeat it.
            run.ttft_at = time.time()
            return await self._broken(run, emit, None, why="the worker running it stopped")
        if job.stream:
            return await self._stream(run, emit)
        return await self._chat(run, emit)

    # -- non-streamed -----------------------------------------------------------------------

    async def _chat(self, run: Run, emit: Emit) -> LedgerEntry:
        job = run.job
        for deployment, bypass, rest in self._passes(run):
            if time.time() >= job.deadline:
                break
            if not bypass and not await self._attempts.allowed(run, deployment):
                continue
            tier = self._tier_faults(deployment)
            response: ChatResponse | None = None
            last = not rest
            try:
                retrying = tier.retry.retrying(deadline=job.deadline, sleep=self._waiter(run))
                async for attempt in retrying:
                    with attempt:
                        response = await self._caller.chat(run, deployment, tier, last=last)
            except Tripped:
                continue
            except BackendError as exc:
                if self._final(exc):
                    break
                continue
            assert response is not None
            self._billing.served(run, deployment)
            entry = self._billing.entry(run, "ok", 200)
            meta = self._billing.meta(run, entry)
            await emit(Reply(job.request_id, "result", response.body, meta))
            return entry
        return await self._fail(run, emit)

    # -- streamed ---------------------------------------------------------------------------

    async def _stream(self, run: Run, emit: Emit) -> LedgerEntry:
        job = run.job
        delivered = Delivered()
        broke: BackendError | None = None  # the mid-stream failure we are recovering from
        previous: str | None = None
        for deployment, bypass, rest in self._passes(run):
            if time.time() >= job.deadline:
                break
            if broke is not None and not self._may_continue(job, delivered, previous, deployment):
                continue
            if not bypass and not await self._attempts.allowed(run, deployment):
                continue
            tier = self._tier_faults(deployment)
            continued = bool(delivered.content)
            body = continuation_body(job.body, delivered) if continued else job.body
            # The last to try, once a stream broke: none of the rest could continue it.
            last = not any(
                broke is None or self._may_continue(job, delivered, previous or deployment, d)
                for d in rest
            )
            try:
                retrying = tier.retry.retrying(deadline=job.deadline, sleep=self._waiter(run))
                async for attempt in retrying:
                    with attempt:
                        await self._caller.stream(
                            run, emit, deployment, tier, body, delivered, last=last
                        )
            except MidStream as exc:
                broke, previous = exc.error, deployment
                continue
            except Tripped:
                continue
            except BackendError as exc:
                if continued and isinstance(exc, BackendRejected):
                    # The candidate refused the continuation (an assistant prefill it does not
                    # take, or a window the answer so far overflows): the next one may take
                    # it; if none does, the stream ends naming the cut, not this refusal.
                    continue
                # A refusal of a fresh request ends the chain; one for the context window
                # does not: another may fit.
                if self._final(exc):
                    break
                continue
            entry = self._billing.entry(run, "ok", 200)
            await emit(Reply(job.request_id, "end", {}, self._billing.meta(run, entry)))
            return entry
        if run.ttft_at is not None:
            return await self._broken(run, emit, broke)
        return await self._fail(run, emit)

    def _may_continue(
        self, job: Job, delivered: Delivered, previous: str | None, deployment: str
    ) -> bool:
        if delivered.tool_calls:
            return False
        if not delivered.content:
            return True  # only the opening chunk went out: a fresh answer is still one answer
        # A rule's continuation action wins over the configured default.
        allowed = self._continuation if job.plan.continuation is None else job.plan.continuation
        return can_continue(
            enabled=allowed,
            body=job.body,
            delivered=delivered,
            capable=[self._continues(previous), self._continues(deployment)],
        )

    def _continues(self, deployment: str | None) -> bool:
        """Whether ``deployment`` accepts continuation (``DeploymentSpec.continues``)."""
        spec = self._catalog.get(deployment) if deployment else None
        return spec is not None and spec.continues

    async def _broken(
        self,
        run: Run,
        emit: Emit,
        error: BackendError | None,
        *,
        why: str = "could not be continued",
    ) -> LedgerEntry:
        """Headers and tokens already reached the client: end the stream honestly, naming
        the failure that broke it (without the replica's internal name)."""
        reason = f": {error.message}" if error is not None else ""
        failure = UpstreamFailed(
            f"the stream broke after it started and {why}{reason}",
            attempts=[a.to_dict() for a in run.attempts],
        )
        entry = self._billing.entry(run, "stream_error", 200)
        await emit(Reply.failed(run.job.request_id, failure, self._billing.meta(run, entry)))
        return entry

    # -- shared -----------------------------------------------------------------------------

    def _candidates(self, job: Job) -> list[str]:
        return [d for d in job.plan.deployments if d in self._pool]

    def _passes(self, run: Run) -> Iterator[tuple[str, bool, tuple[str, ...]]]:
        """The plan's deployments, breakers respected; then, when no answer came, the ones
        their breaker skipped, in order, breakers bypassed: a breaker orders the chain, and is
        never the only reason a request fails. With each: whether its breaker is bypassed, and
        the deployments that may still be tried after it (none: it is the last)."""
        candidates = self._candidates(run.job)

        def skipped() -> list[str]:
            gone = {a.deployment for a in run.attempts if a.outcome == "circuit_open"}
            return [d for d in candidates if d in gone]

        for i, deployment in enumerate(candidates):
            later = candidates[i + 1 :]
            yield deployment, False, (*later, *(d for d in skipped() if d not in later))
        bypassed = skipped()
        for i, deployment in enumerate(bypassed):
            yield deployment, True, tuple(bypassed[i + 1 :])

    def _waiter(self, run: Run) -> Sleep:
        """The retry policy's sleep, counting the run's waits (not the gateway's overhead)."""

        async def wait(seconds: float) -> None:
            run.waited_s += seconds
            await self._sleep(seconds)

        return wait

    def _tier_faults(self, deployment: str) -> TierFaults:
        spec = self._catalog.get(deployment)
        return self._faults.get(spec.tier, TierFaults()) if spec else TierFaults()

    @staticmethod
    def _final(exc: BackendError) -> bool:
        """Whether to stop trying further deployments after ``exc``: only a request the
        backend rejects (other than for its context window) ends the chain."""
        if isinstance(exc, ContextLengthExceeded):
            return False
        return isinstance(exc, BackendRejected)

    async def _fail(self, run: Run, emit: Emit) -> LedgerEntry:
        error = self._error_for(run)
        entry = self._billing.entry(run, error.outcome, error.status)
        await emit(Reply.failed(run.job.request_id, error, self._billing.meta(run, entry)))
        return entry

    def _error_for(self, run: Run) -> GatewayError:
        """The client's error when no deployment answered, by the last failure: a refusal is
        the request's (400, the provider's own code kept), a context window with nowhere else
        to go too (400 ``context_length_exceeded``), a rate limit stays a 429 with its
        ``Retry-After``; else 504 past the deadline, or one 502 naming every attempt."""
        attempts = [a.to_dict() for a in run.attempts]
        if not run.attempts:
            return UpstreamFailed("no deployment of the route plan is available", attempts=attempts)
        last = run.attempts[-1]
        error = run.last_error
        said = error.message if error is not None else (last.error or "")
        if last.outcome == ContextLengthExceeded.kind:
            return ContextTooLong(
                f"the prompt does not fit the model's context window: {said}", param="messages"
            )
        if last.outcome == "rejected":
            code = error.code if error is not None and error.code else None
            refused = InvalidRequest(
                f"the model rejected the request: {said}", code=code or "backend_rejected"
            )
            refused.booked_as = "backend_rejected"
            return refused
        if time.time() >= run.job.deadline:
            return DeadlineExceeded("the request did not finish before its deadline")
        if last.outcome == "rate_limited":
            return RateLimited(
                f"the model is rate limited: {said}",
                retry_after=error.retry_after if error is not None else None,
            )
        tried = ", ".join(f"{a.deployment}: {a.outcome}" for a in run.attempts)
        return UpstreamFailed(
            f"every deployment of the route plan failed ({tried})", attempts=attempts
        )
