"""Runs one job: try the plan's deployments in order, relay the answer, account for every attempt.

The first version moves to the next deployment on any retryable error or context overflow, and
stops on a request the backend rejects. Streams fall back only before their first chunk; after
it, a failure ends the stream with an explicit error event. Retries with backoff, breakers and
mid-stream continuation deepen this in the fault-handling work.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from backends.errors import BackendError, ContextLengthExceeded
from backends.types import ChatRequest, Usage
from gateway.accounting.records import Attempt, LedgerEntry, to_micro
from gateway.errors import DeadlineExceeded, GatewayError, InvalidRequest, UpstreamFailed
from gateway.queue.jobs import Job, Reply
from gateway.queue.pool import BackendPool
from router.catalog import Catalog

__all__ = ["Emit", "Executor", "PriceLookup"]

Emit = Callable[[Reply], Awaitable[None]]


class PriceLookup(Protocol):
    """What the executor needs of prices: cost of tokens on a model (``None`` = unknown)."""

    def cost(self, model: str, usage: Usage) -> Decimal | None: ...


@dataclass(slots=True)
class _Run:
    """What happened while serving one job."""

    job: Job
    picked_at: float
    attempts: list[Attempt] = field(default_factory=list)
    usage_total: list[Usage] = field(default_factory=list)
    backend_s: float = 0.0
    ttft_at: float | None = None
    deployment: str | None = None

    def record(
        self, deployment: str, outcome: str, started: float, usage: Usage | None, error: str | None
    ) -> None:
        elapsed = time.time() - started
        self.backend_s += elapsed
        self.attempts.append(
            Attempt(
                deployment=deployment,
                outcome=outcome,
                latency_ms=elapsed * 1000,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                error=error,
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
    ) -> None:
        self._pool = pool
        self._prices = prices
        self._catalog = catalog
        self._baselines = baselines

    async def run(self, job: Job, emit: Emit) -> LedgerEntry:
        run = _Run(job=job, picked_at=time.time())
        if run.picked_at >= job.deadline:
            error: GatewayError = DeadlineExceeded(
                "the request could not start before its deadline"
            )
            await emit(Reply(job.request_id, "error", error.body(), {"status": error.status}))
            return self._entry(run, error.outcome, error.status)
        if job.stream:
            return await self._stream(run, emit)
        return await self._chat(run, emit)

    # -- non-streamed -----------------------------------------------------------------------

    async def _chat(self, run: _Run, emit: Emit) -> LedgerEntry:
        job = run.job
        for deployment in self._candidates(job):
            started = time.time()
            try:
                async with self._pool.lease(deployment) as backend:
                    response = await backend.chat(self._request(job, deployment, started))
            except BackendError as exc:
                run.record(deployment, exc.kind, started, None, str(exc))
                if self._final(exc, started, job):
                    break
                continue
            run.record(deployment, "ok", started, response.usage, None)
            run.deployment = deployment
            entry = self._entry(run, "ok", 200)
            await emit(Reply(job.request_id, "result", response.body, self._meta(run, entry)))
            return entry
        return await self._fail(run, emit)

    # -- streamed ---------------------------------------------------------------------------

    async def _stream(self, run: _Run, emit: Emit) -> LedgerEntry:
        job = run.job
        for deployment in self._candidates(job):
            started = time.time()
            usage: Usage | None = None
            sent = 0
            try:
                async with self._pool.lease(deployment) as backend:
                    async for chunk in backend.stream(self._request(job, deployment, started)):
                        if chunk.usage is not None:
                            usage = chunk.usage
                        if sent == 0:
                            run.ttft_at = time.time()
                            run.deployment = deployment
                            meta = self._route_meta(run)
                            await emit(Reply(job.request_id, "chunk", chunk.data, meta))
                        else:
                            await emit(Reply(job.request_id, "chunk", chunk.data))
                        sent += 1
            except BackendError as exc:
                run.record(deployment, exc.kind, started, usage, str(exc))
                if sent:
                    # Headers and tokens already reached the client: end the stream honestly.
                    failure = UpstreamFailed(f"the stream broke after it started: {exc}")
                    entry = self._entry(run, "stream_error", 200)
                    meta = {**self._meta(run, entry), "status": failure.status}
                    await emit(Reply(job.request_id, "error", failure.body(), meta))
                    return entry
                if self._final(exc, started, job):
                    break
                continue
            run.record(deployment, "ok", started, usage, None)
            entry = self._entry(run, "ok", 200)
            await emit(Reply(job.request_id, "end", {}, self._meta(run, entry)))
            return entry
        return await self._fail(run, emit)

    # -- shared -----------------------------------------------------------------------------

    def _candidates(self, job: Job) -> list[str]:
        return [d for d in job.plan.deployments if d in self._pool]

    @staticmethod
    def _final(exc: BackendError, started: float, job: Job) -> bool:
        """Whether to stop trying further deployments after ``exc``."""
        if isinstance(exc, ContextLengthExceeded):
            return False
        return not exc.retryable or time.time() >= job.deadline

    def _request(self, job: Job, deployment: str, now: float) -> ChatRequest:
        body = dict(job.body)
        if job.stream:
            options = dict(body.get("stream_options") or {})
            options["include_usage"] = True  # billing needs usage, whatever the client asked
            body["stream_options"] = options
        return ChatRequest(
            model=deployment,
            body=body,
            request_id=job.request_id,
            timeout_s=max(job.deadline - now, 0.001),
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
        cost, baseline, known = self._costs(job, run)
        spec = self._catalog.get(run.deployment) if run.deployment else None
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
            tags=job.tags,
            prompt_tokens=sum(u.prompt_tokens for u in run.usage_total),
            completion_tokens=sum(u.completion_tokens for u in run.usage_total),
            cost_micro_usd=cost,
            baseline_micro_usd=baseline,
            price_known=known,
            latency_ms=(now - job.received_at) * 1000,
            ttft_ms=None if run.ttft_at is None else (run.ttft_at - job.received_at) * 1000,
            queue_ms=(run.picked_at - job.enqueued_at) * 1000,
            attempts=tuple(run.attempts),
        )

    def _costs(self, job: Job, run: _Run) -> tuple[int | None, int | None, bool]:
        """Cost and baseline of every attempt that produced tokens, in micro-dollars; ``None``
        where a price is unknown (flagged, never booked as zero)."""
        cost: Decimal | None = Decimal(0)
        baseline: Decimal | None = Decimal(0)
        baseline_model = self._baselines.get(job.tenant)
        for attempt in run.attempts:
            if not (attempt.prompt_tokens or attempt.completion_tokens):
                continue
            usage = Usage(attempt.prompt_tokens, attempt.completion_tokens)
            price = self._prices.cost(attempt.deployment, usage)
            base = self._prices.cost(baseline_model, usage) if baseline_model else None
            cost = None if cost is None or price is None else cost + price
            baseline = None if baseline is None or base is None else baseline + base
        return (
            None if cost is None else to_micro(cost),
            None if baseline is None else to_micro(baseline),
            cost is not None,
        )

    def _route_meta(self, run: _Run) -> dict[str, Any]:
        spec = self._catalog.get(run.deployment) if run.deployment else None
        return {
            "deployment": run.deployment,
            "tier": spec.tier.value if spec else run.job.plan.tier.value,
            "queue_ms": (run.picked_at - run.job.enqueued_at) * 1000,
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
