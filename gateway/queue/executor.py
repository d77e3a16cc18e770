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
   cancelled after it was sent) is booked from estimates, flagged
   (``gateway.accounting.estimates``).

Each call is held to the tier's per-attempt timeout and the request's deadline. A stream falls
back freely until its first token; after it, when continuation is allowed
(``gateway.faults.continuation``), the next vLLM deployment continues the delivered text and
the client sees one answer; otherwise the stream ends with an explicit error event. An answer
served by a lower tier than planned is flagged as a downgrade (``gateway.faults.chains``).

A job whose client went away is ``abandon``ed and its task cancelled: the backend call is
aborted (vLLM stops generating when its connection closes), and the job ends with outcome
``client_disconnected`` (499), billed for the tokens that reached us before (a hosted API's call:
estimated, as above).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from backends.errors import BackendError, BackendRejected, ContextLengthExceeded
from backends.protocol import Backend
from backends.types import ChatChunk, ChatRequest, ChatResponse, Usage
from gateway.accounting.estimates import billed_without_usage, estimate, output_text
from gateway.accounting.records import Attempt, LedgerEntry, to_micro
from gateway.errors import (
    ClientDisconnected,
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    UpstreamFailed,
)
from gateway.faults.breaker import BreakerState, RedisBreaker
from gateway.faults.chains import DOWNGRADE_TAG, TierFaults, is_downgrade
from gateway.faults.continuation import Delivered, can_continue, continuation_body, is_role_only
from gateway.faults.drain import InflightCalls
from gateway.faults.marks import StreamMarks
from gateway.faults.policy import Sleep
from gateway.observability.tracing import Tracing
from gateway.queue.jobs import Job, Reply
from gateway.queue.pool import BackendPool
from router.catalog import Catalog, Tier

__all__ = ["AttemptCounter", "Emit", "Executor", "PriceLookup"]

Emit = Callable[[Reply], Awaitable[None]]


class PriceLookup(Protocol):
    """What the executor needs of prices: cost of tokens on a model (``None`` = unknown)."""

    def cost(self, model: str, usage: Usage) -> Decimal | None: ...


class AttemptCounter(Protocol):
    """Counts backend calls by deployment and outcome (``Metrics.attempts``)."""

    def labels(self, deployment: str, outcome: str) -> Any: ...


class _Tripped(Exception):
    """A failure that opened the deployment's breaker: move on instead of retrying in place."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


class _MidStream(Exception):
    """A stream broke after it delivered chunks to the client (never retried in place)."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class _Streamed:
    """What one streamed attempt delivered so far."""

    body: Mapping[str, Any]
    """The body the attempt sent."""
    external: bool
    """To a hosted API (``DeploymentSpec.external``)."""
    usage: Usage | None = None
    """The last usage the backend reported: at the end, or (vLLM, continuous usage stats) in
    every chunk, so a stream that broke still has its prompt and completion tokens so far."""
    called: bool = False
    """The request went out (the attempt did not end while waiting for a slot)."""
    received: int = 0
    """Chunks the backend sent (the opening role-only one included)."""
    produced: int = 0
    """Content tokens it delivered (one per chunk; an estimate otherwise)."""
    sent: int = 0
    """Chunks it sent to the client."""
    text: list[str] = field(default_factory=list)
    """The text of the chunks that came without usage (a hosted API's), for an estimate."""

    def billed(self, outcome: str) -> tuple[Usage | None, bool]:
        """What the attempt is booked, ending with ``outcome``, and whether it is an estimate:
        the backend's usage; else, when its provider bills the call anyway, an estimate."""
        if self.usage is not None:
            return self.usage, False
        if billed_without_usage(
            outcome, external=self.external, sent=self.called, answered=self.received > 0
        ):
            return estimate(self.body, self.text, self.produced), True
        return None, False


@dataclass(slots=True)
class _Run:
    """What happened while serving one job."""

    job: Job
    picked_at: float
    reclaimed: bool = False
    """Taken over from a worker that died: it may have sent part of a stream already."""
    local: bool = False
    """The client waits in this process (a job started at once): nothing crosses Redis."""
    attempts: list[Attempt] = field(default_factory=list)
    usage_total: list[Usage] = field(default_factory=list)
    backend_s: float = 0.0
    attempt_at: float = 0.0
    """When the current backend attempt started (``time.time()``)."""
    ttft_at: float | None = None
    deployment: str | None = None
    downgraded: bool = False

    def record(
        self,
        deployment: str,
        outcome: str,
        started: float,
        usage: Usage | None,
        error: str | None,
        estimated: bool = False,
    ) -> None:
        elapsed = max(time.time() - started, 0.0)
        self.backend_s += elapsed
        self.attempts.append(
            Attempt(
                deployment=deployment,
                outcome=outcome,
                latency_ms=elapsed * 1000,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                error=error,
                estimated=estimated,
            )
        )
        if usage is not None:
            self.usage_total.append(usage)


class Executor:
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
        attempts_metric: AttemptCounter | None = None,
        sleep: Sleep = asyncio.sleep,
        stream_marks: StreamMarks | None = None,
        tracing: Tracing | None = None,
        inflight: InflightCalls | None = None,
    ) -> None:
        self._pool = pool
        self._prices = prices
        self._catalog = catalog
        self._baselines = baselines  # read at each booking: TenantDirectory.baselines
        self._breaker = breaker
        self._faults = dict(faults or {})
        self._continuation = continuation
        self._attempts_metric = attempts_metric
        self._sleep = sleep
        self._marks = stream_marks
        self._tracing = tracing or Tracing.off()
        self._inflight = inflight or InflightCalls()
        self._abandoned: set[str] = set()

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
            entry = await self._guarded(_Run(job, time.time(), reclaimed, local), emit)
            self._tracing.job_done(span, entry)
            return entry

    async def _guarded(self, run: _Run, emit: Emit) -> LedgerEntry:
        """``_run``, ended as ``client_disconnected`` when the job is abandoned."""
        job = run.job
        try:
            return await self._run(run, emit)
        except asyncio.CancelledError:
            if job.request_id not in self._abandoned:
                raise  # shutting down: the worker hands the job back
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            gone = ClientDisconnected("the client closed the connection")
            return self._entry(run, gone.outcome, gone.status)
        finally:
            self._abandoned.discard(job.request_id)

    async def _run(self, run: _Run, emit: Emit) -> LedgerEntry:
        job = run.job
        if run.picked_at >= job.deadline:
            error: GatewayError = DeadlineExceeded(
                "the request could not start before its deadline"
            )
            await emit(Reply(job.request_id, "error", error.body(), {"status": error.status}))
            return self._entry(run, error.outcome, error.status)
        if (
            job.stream
            and run.reclaimed
            and self._marks is not None
            and await self._marks.started(job.request_id)
        ):
            # A run before this one (its worker died) already sent part of the answer, which
            # this run cannot see: starting over would repeat it.
            run.ttft_at = time.time()
            return await self._broken(run, emit, None, why="the worker running it stopped")
        if job.stream:
            return await self._stream(run, emit)
        return await self._chat(run, emit)

    # -- non-streamed -----------------------------------------------------------------------

    async def _chat(self, run: _Run, emit: Emit) -> LedgerEntry:
        job = run.job
        for deployment, bypass in self._passes(run):
            if time.time() >= job.deadline:
                break
            if not bypass and not await self._allowed(run, deployment):
                continue
            tier = self._tier_faults(deployment)
            response: ChatResponse | None = None
            try:
                retrying = tier.retry.retrying(deadline=job.deadline, sleep=self._sleep)
                async for attempt in retrying:
                    with attempt:
                        response = await self._call(run, deployment, tier)
            except _Tripped:
                continue
            except BackendError as exc:
                if self._final(exc):
                    break
                continue
            assert response is not None
            self._served(run, deployment)
            entry = self._entry(run, "ok", 200)
            await emit(Reply(job.request_id, "result", response.body, self._meta(run, entry)))
            return entry
        return await self._fail(run, emit)

    async def _call(self, run: _Run, deployment: str, tier: TierFaults) -> ChatResponse:
        started = time.time()
        server: str | None = None
        body = run.job.body
        sent = False
        try:
            async with self._pool.lease(deployment, affinity=run.job.conversation) as backend:
                server = backend.address if self._tracing.enabled else None
                request = self._request(run.job, body, deployment, started, tier)
                async with self._inflight.watching(deployment):  # ended if it is drained
                    sent = True
                    response = await backend.chat(request)
        except asyncio.CancelledError:
            why = "cancelled during the call"
            usage, guess = self._unanswered(deployment, body, "cancelled", sent)
            self._record(
                run, deployment, "cancelled", started, usage, why, server=server, estimated=guess
            )
            raise
        except BackendError as exc:
            usage, guess = self._unanswered(deployment, body, exc.kind, sent)
            if await self._failed(
                run, deployment, exc, started, usage, server=server, estimated=guess
            ):
                raise _Tripped(exc) from exc
            raise
        usage, guess = response.usage, False
        if usage is None:  # an answer without usage is billed all the same
            usage, guess = estimate(body, output_text(response.body)), True
        self._record(run, deployment, "ok", started, usage, None, server=server, estimated=guess)
        await self._succeeded(deployment)
        return response

    def _unanswered(
        self, deployment: str, body: Mapping[str, Any], outcome: str, sent: bool
    ) -> tuple[Usage | None, bool]:
        """What a non-streamed call that got no answer is booked, and whether it is an
        estimate: nothing, unless its provider bills it anyway (``estimates``)."""
        external = self._external(deployment)
        if billed_without_usage(outcome, external=external, sent=sent, answered=False):
            return estimate(body), True
        return None, False

    # -- streamed ---------------------------------------------------------------------------

    async def _stream(self, run: _Run, emit: Emit) -> LedgerEntry:
        job = run.job
        delivered = Delivered()
        broke: BackendError | None = None  # the mid-stream failure we are recovering from
        previous: str | None = None
        for deployment, bypass in self._passes(run):
            if time.time() >= job.deadline:
                break
            if broke is not None and not self._may_continue(job, delivered, previous, deployment):
                continue
            if not bypass and not await self._allowed(run, deployment):
                continue
            tier = self._tier_faults(deployment)
            body = continuation_body(job.body, delivered) if delivered.content else job.body
            try:
                retrying = tier.retry.retrying(deadline=job.deadline, sleep=self._sleep)
                async for attempt in retrying:
                    with attempt:
                        await self._stream_once(run, emit, deployment, tier, body, delivered)
            except _MidStream as exc:
                broke, previous = exc.error, deployment
                continue
            except _Tripped:
                continue
            except BackendError as exc:
                if delivered.tokens and isinstance(exc, BackendRejected):
                    broke = exc  # the continuation was refused: end the stream honestly
                    break
                if self._final(exc):
                    break
                continue
            entry = self._entry(run, "ok", 200)
            await emit(Reply(job.request_id, "end", {}, self._meta(run, entry)))
            return entry
        if run.ttft_at is not None:
            return await self._broken(run, emit, broke)
        return await self._fail(run, emit)

    async def _stream_once(
        self,
        run: _Run,
        emit: Emit,
        deployment: str,
        tier: TierFaults,
        body: Mapping[str, Any],
        delivered: Delivered,
    ) -> None:
        job = run.job
        started = run.attempt_at = time.time()
        got = _Streamed(body, external=self._external(deployment))
        resumed = run.ttft_at is not None
        server: str | None = None
        try:
            async with (
                self._pool.lease(deployment, affinity=run.job.conversation) as backend,
                contextlib.aclosing(
                    self._open(backend, job, body, deployment, started, tier)
                ) as it,
            ):
                server = backend.address if self._tracing.enabled else None
                await self._relay(run, emit, deployment, it, delivered, got)
        except asyncio.CancelledError:
            # What it delivered before the call was aborted.
            why = "cancelled during the stream"
            usage, guess = got.billed("cancelled")
            self._record(
                run, deployment, "cancelled", started, usage, why,
                server=server, resumed=resumed, estimated=guess,
            )  # fmt: skip
            raise
        except BackendError as exc:
            usage, guess = got.billed(exc.kind)
            tripped = await self._failed(
                run, deployment, exc, started, usage,
                server=server, resumed=resumed, estimated=guess,
            )  # fmt: skip
            if got.sent:
                raise _MidStream(exc) from exc
            if tripped:
                raise _Tripped(exc) from exc
            raise
        usage, guess = got.billed("ok")
        self._record(
            run, deployment, "ok", started, usage, None,
            server=server, resumed=resumed, estimated=guess,
        )  # fmt: skip
        await self._succeeded(deployment)

    async def _relay(
        self,
        run: _Run,
        emit: Emit,
        deployment: str,
        chunks: AsyncIterator[ChatChunk],
        delivered: Delivered,
        got: _Streamed,
    ) -> None:
        """Send one attempt's chunks to the client, counting what it delivered in ``got``."""
        job = run.job
        resumed = run.ttft_at is not None
        got.called = True  # by the first ``anext``
        async for chunk in chunks:
            got.received += 1
            if chunk.usage is not None:
                got.usage = chunk.usage
            else:
                got.text.extend(output_text(chunk.data))
            data = chunk.data
            if resumed:
                if is_role_only(data):
                    continue
                if delivered.completion_id:
                    data = {**data, "id": delivered.completion_id}
            got.produced += delivered.add(data)
            if run.ttft_at is None:
                await self._first_chunk(run, emit, deployment, data)
            else:
                if got.sent == 0:
                    self._served(run, deployment)
                await emit(Reply(job.request_id, "chunk", data))
            got.sent += 1

    async def _first_chunk(
        self, run: _Run, emit: Emit, deployment: str, data: dict[str, Any]
    ) -> None:
        """The stream's first chunk to the client: it carries the route (headers)."""
        job = run.job
        run.ttft_at = time.time()
        self._served(run, deployment)
        ttl_s = job.deadline - run.ttft_at + 60
        if self._marks is not None and not run.local:
            await self._marks.mark(job.request_id, ttl_s)  # before the chunk leaves the process
        # Backend time to this first chunk: earlier failed attempts, and this one so far.
        backend_ms = (run.backend_s + run.ttft_at - run.attempt_at) * 1000
        meta = {**self._route_meta(run), "backend_ms": backend_ms}
        await emit(Reply(job.request_id, "chunk", data, meta))
        if self._marks is not None and run.local:
            # The client is in this process: queued after the chunk, whose relay goes first.
            await self._marks.mark(job.request_id, ttl_s, wait=False)

    def _open(
        self,
        backend: Backend,
        job: Job,
        body: Mapping[str, Any],
        deployment: str,
        started: float,
        tier: TierFaults,
    ) -> Any:
        return backend.stream(self._request(job, body, deployment, started, tier))

    def _may_continue(
        self, job: Job, delivered: Delivered, previous: str | None, deployment: str
    ) -> bool:
        if delivered.tool_calls:
            return False
        if not delivered.content:
            return True  # only the opening chunk went out: a fresh answer is still one answer
        providers = [self._provider(previous), self._provider(deployment)]
        # A rule's continuation action wins over the configured default.
        allowed = self._continuation if job.plan.continuation is None else job.plan.continuation
        return can_continue(
            enabled=allowed,
            body=job.body,
            delivered=delivered,
            providers=providers,
        )

    async def _broken(
        self,
        run: _Run,
        emit: Emit,
        error: BackendError | None,
        *,
        why: str = "could not be continued",
    ) -> LedgerEntry:
        """Headers and tokens already reached the client: end the stream honestly."""
        reason = f": {error}" if error is not None else ""
        failure = UpstreamFailed(
            f"the stream broke after it started and {why}{reason}",
            attempts=[a.to_dict() for a in run.attempts],
        )
        entry = self._entry(run, "stream_error", 200)
        meta = {**self._meta(run, entry), "status": failure.status}
        await emit(Reply(run.job.request_id, "error", failure.body(), meta))
        return entry

    # -- shared -----------------------------------------------------------------------------

    def _candidates(self, job: Job) -> list[str]:
        return [d for d in job.plan.deployments if d in self._pool]

    def _passes(self, run: _Run) -> Iterator[tuple[str, bool]]:
        """The plan's deployments, breakers respected; then, when no answer came, the ones
        their breaker skipped, in order, breakers bypassed: a breaker orders the chain, and is
        never the only reason a request fails."""
        candidates = self._candidates(run.job)
        for deployment in candidates:
            yield deployment, False
        skipped = {a.deployment for a in run.attempts if a.outcome == "circuit_open"}
        for deployment in candidates:
            if deployment in skipped:
                yield deployment, True

    def _provider(self, deployment: str | None) -> str:
        spec = self._catalog.get(deployment) if deployment else None
        return spec.provider if spec else "unknown"

    def _external(self, deployment: str) -> bool:
        """Served by a hosted API, which bills us (``DeploymentSpec.external``)."""
        spec = self._catalog.get(deployment)
        return spec is not None and spec.external

    def _tier_faults(self, deployment: str) -> TierFaults:
        spec = self._catalog.get(deployment)
        return self._faults.get(spec.tier, TierFaults()) if spec else TierFaults()

    def _served(self, run: _Run, deployment: str) -> None:
        run.deployment = deployment
        spec = self._catalog.get(deployment)
        run.downgraded = spec is not None and is_downgrade(run.job.plan.tier, spec.tier)

    async def _allowed(self, run: _Run, deployment: str) -> bool:
        if self._breaker is None or await self._breaker.allow(deployment):
            return True
        self._record(run, deployment, "circuit_open", time.time(), None, "circuit breaker open")
        self._count(deployment, "circuit_open")
        return False

    async def _failed(
        self,
        run: _Run,
        deployment: str,
        exc: BackendError,
        started: float,
        usage: Usage | None,
        *,
        server: str | None = None,
        resumed: bool = False,
        estimated: bool = False,
    ) -> bool:
        """Record a failed call; whether the deployment's breaker is open now."""
        self._record(
            run, deployment, exc.kind, started, usage, str(exc),
            server=server, resumed=resumed, estimated=estimated,
        )  # fmt: skip
        self._count(deployment, exc.kind)
        if self._breaker is None or not exc.retryable:
            return False
        return await self._breaker.record(deployment, ok=False) is BreakerState.OPEN

    def _record(
        self,
        run: _Run,
        deployment: str,
        outcome: str,
        started: float,
        usage: Usage | None,
        error: str | None,
        *,
        server: str | None = None,
        resumed: bool = False,
        estimated: bool = False,
    ) -> None:
        """One attempt: in the ledger row, and as a ``backend.attempt`` span. Its kind says
        why it happened: ``first``, a ``retry`` on the same deployment, a ``fallback`` to the
        next, or a ``continuation`` of a stream that broke; ``reason``: the previous outcome.
        ``estimated``: ``usage`` is the gateway's estimate (``gateway.accounting.estimates``)."""
        previous = run.attempts[-1] if run.attempts else None
        run.record(deployment, outcome, started, usage, error, estimated)
        if not self._tracing.enabled:
            return
        if resumed:
            kind = "continuation"
        elif previous is None:
            kind = "first"
        else:
            kind = "retry" if previous.deployment == deployment else "fallback"
        self._tracing.attempt(
            deployment=deployment,
            provider=self._provider(deployment),
            number=len(run.attempts),
            kind=kind,
            reason=previous.outcome if previous is not None else None,
            outcome=outcome,
            started=started,
            ended=time.time(),
            server=server,
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
        )

    async def _succeeded(self, deployment: str) -> None:
        self._count(deployment, "ok")
        if self._breaker is not None:
            await self._breaker.record(deployment, ok=True)

    def _count(self, deployment: str, outcome: str) -> None:
        if self._attempts_metric is not None:
            self._attempts_metric.labels(deployment, outcome).inc()

    @staticmethod
    def _final(exc: BackendError) -> bool:
        """Whether to stop trying further deployments after ``exc``: only a request the
        backend rejects (other than for its context window) ends the chain."""
        if isinstance(exc, ContextLengthExceeded):
            return False
        return isinstance(exc, BackendRejected)

    def _request(
        self,
        job: Job,
        body: Mapping[str, Any],
        deployment: str,
        now: float,
        tier: TierFaults,
    ) -> ChatRequest:
        out = dict(body)
        if job.stream:
            options = dict(out.get("stream_options") or {})
            options["include_usage"] = True  # billing needs usage, whatever the client asked
            out["stream_options"] = options
        return ChatRequest(
            model=deployment,
            body=out,
            request_id=job.request_id,
            timeout_s=max(min(tier.attempt_s, job.deadline - now), 0.001),
        )

    async def _fail(self, run: _Run, emit: Emit) -> LedgerEntry:
        error = self._error_for(run)
        entry = self._entry(run, error.outcome, error.status)
        meta = {**self._meta(run, entry), "status": error.status}
        await emit(Reply(run.job.request_id, "error", error.body(), meta))
        return entry

    def _error_for(self, run: _Run) -> GatewayError:
        attempts = [a.to_dict() for a in run.attempts]
        if not run.attempts:
            return UpstreamFailed("no deployment of the route plan is available", attempts=attempts)
        last = run.attempts[-1]
        if last.outcome == "rejected":
            return InvalidRequest(
                f"the model rejected the request: {last.error}", code="backend_rejected"
            )
        if time.time() >= run.job.deadline:
            return DeadlineExceeded("the request did not finish before its deadline")
        tried = ", ".join(f"{a.deployment}: {a.outcome}" for a in run.attempts)
        return UpstreamFailed(
            f"every deployment of the route plan failed ({tried})", attempts=attempts
        )

    def _entry(self, run: _Run, outcome: str, status: int) -> LedgerEntry:
        job = run.job
        now = time.time()
        cost, baseline, known, estimated = self._costs(job, run)
        spec = self._catalog.get(run.deployment) if run.deployment else None
        tags = (*job.tags, DOWNGRADE_TAG) if run.downgraded else job.tags
        return LedgerEntry(
            request_id=job.request_id,
            tenant=job.tenant,
            principal=job.principal,
            created_at=datetime.fromtimestamp(job.received_at, UTC),
            outcome=outcome,
            status_code=status,
            requested_model=job.plan.requested_model,
            tier=spec.tier.value if spec else job.plan.tier.value,
            deployment=run.deployment,
            rule=job.plan.rule,
            score=job.plan.score,
            stream=job.stream,
            app=job.app,
            tags=tags,
            prompt_tokens=sum(u.prompt_tokens for u in run.usage_total),
            completion_tokens=sum(u.completion_tokens for u in run.usage_total),
            cost_micro_usd=cost,
            baseline_micro_usd=baseline,
            price_known=known,
            latency_ms=(now - job.received_at) * 1000,
            ttft_ms=None if run.ttft_at is None else (run.ttft_at - job.received_at) * 1000,
            queue_ms=(run.picked_at - job.enqueued_at) * 1000,
            attempts=tuple(run.attempts),
            idempotency_key=None if job.stream else job.idempotency_key,  # it ran under the key
            estimated_micro_usd=estimated,
        )

    def _costs(self, job: Job, run: _Run) -> tuple[int | None, int | None, bool, int | None]:
        """Cost and baseline of every attempt that produced tokens, in micro-dollars; ``None``
        where a price is unknown (flagged, never booked as zero). Then whether the price is
        known, and the part of the cost priced from estimated tokens (``None``: no estimate;
        0 when the cost is unknown, as ``LedgerEntry.estimated_micro_usd`` says)."""
        cost: Decimal | None = Decimal(0)
        baseline: Decimal | None = Decimal(0)
        estimated: Decimal | None = None
        baseline_model = self._baselines.get(job.tenant)
        for attempt in run.attempts:
            if not (attempt.prompt_tokens or attempt.completion_tokens):
                continue
            usage = Usage(attempt.prompt_tokens, attempt.completion_tokens)
            price = self._prices.cost(attempt.deployment, usage)
            base = self._prices.cost(baseline_model, usage) if baseline_model else None
            cost = None if cost is None or price is None else cost + price
            baseline = None if baseline is None or base is None else baseline + base
            if attempt.estimated:
                estimated = (estimated or Decimal(0)) + (price or Decimal(0))
        if estimated is not None and cost is None:
            estimated = Decimal(0)  # the cost is unknown: none of it is in any sum
        return (
            None if cost is None else to_micro(cost),
            None if baseline is None else to_micro(baseline),
            cost is not None,
            None if estimated is None else to_micro(estimated),
        )

    def _route_meta(self, run: _Run) -> dict[str, Any]:
        spec = self._catalog.get(run.deployment) if run.deployment else None
        return {
            "deployment": run.deployment,
            "tier": spec.tier.value if spec else run.job.plan.tier.value,
            "queue_ms": (run.picked_at - run.job.enqueued_at) * 1000,
            "downgraded": run.downgraded,
        }

    def _meta(self, run: _Run, entry: LedgerEntry) -> dict[str, Any]:
        cost = entry.cost_usd
        return {
            **self._route_meta(run),
            "cost_usd": None if cost is None else str(cost),
            "backend_ms": run.backend_s * 1000,
            "prompt_tokens": entry.prompt_tokens,
            "completion_tokens": entry.completion_tokens,
        }
