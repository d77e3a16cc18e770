"""One backend call of a run: lease a replica, send the request, book the call however it ends.

``Caller.chat`` makes one non-streamed call, ``Caller.stream`` one streamed call (its chunks
relayed to the client, ``gateway.queue.running.stream_relay``), to one deployment of the plan. Each
call:

- leases a replica of the deployment (``gateway.queue.replicas.pool``) and sends the request (a
  stream's with its usage asked for: billing needs it, whatever the client asked), held to the
  tier's per-attempt timeout and the request's deadline;
- is one attempt (``gateway.queue.running.attempts``): booked with the tokens its backend billed,
or,
  for a call its provider bills without telling us, an estimate, flagged
  (``gateway.accounting.estimates``); a call cancelled because its client went away, or because
  the worker is shutting down, is booked as cancelled, with why;
- tells the executor that walks the chain (``gateway.queue.running.executor``) how to go on: a
  ``BackendError`` to retry or move on, ``Tripped`` when the failure opened the deployment's
  breaker, ``MidStream`` when a stream broke after it sent chunks to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Container, Mapping
from typing import Any

from backends.errors import BackendError, BackendTimeout
from backends.protocol import Backend
from backends.types import ChatRequest, ChatResponse, Usage
from gateway.accounting.estimates import billed_without_usage, estimate, output_text, unreadable
from gateway.faults.chains import TierFaults
from gateway.faults.continuation import Delivered
from gateway.faults.drain import InflightCalls
from gateway.observability.tracing import Tracing
from gateway.queue.billing import Billing
from gateway.queue.jobs import Emit, Job
from gateway.queue.replicas.pool import BackendPool
from gateway.queue.run import Run
from gateway.queue.running.attempts import Attempts
from gateway.queue.running.stream_relay import Streamed, StreamRelay

__all__ = ["Caller", "MidStream", "Tripped", "cut_by_deadline"]

_CLOCK_SLACK_S = 0.05
"""A timer due at the deadline may fire this much before the wall clock reaches it."""


def cut_by_deadline(
    exc: BackendError, job: Job, tier: TierFaults, started: float, *, first: bool = True
) -> bool:
    """Whether ``exc`` is the request's own deadline ending a call it had cut short: a timeout,
    on a call held to less than the tier's per-attempt budget because the deadline came first,
    raised when that deadline had come; or a timeout of the wait for a first output (``first``:
    nothing had arrived) that the deadline held to its share of the time left, below the tier's
    own limit (``TierFaults.first_wait``), raised when that share was up. Such a failure is
    the request's, not the backend's (a connect, first-token or stall timeout within the tier's
    own limits still is the backend's)."""
    if not isinstance(exc, BackendTimeout):
        return False
    now = time.time()
    if job.deadline - started < tier.attempt_s and now >= job.deadline - _CLOCK_SLACK_S:
        return True
    limit = tier.first_token_s if job.stream else tier.first_byte_s
    share_s = tier.share * (job.deadline - started)
    return (
        first
        and limit is not None
        and share_s < limit
        and now >= started + share_s - _CLOCK_SLACK_S
    )


class Tripped(Exception):
    """A failure that opened the deployment's breaker: move on instead of retrying in place."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


class MidStream(Exception):
    """A stream broke after it delivered chunks to the client (never retried in place)."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


class Caller:
    """Makes a run's backend calls, one ``chat`` or ``stream`` per attempt, each booked."""

    def __init__(
        self,
        pool: BackendPool,
        billing: Billing,
        attempts: Attempts,
        relay: StreamRelay,
        *,
        tracing: Tracing,
        inflight: InflightCalls,
        abandoned: Container[str],
    ) -> None:
        """``abandoned``: the request ids whose client went away (the executor's, read when a
        call is cancelled: any other call cancelled is being handed back at shutdown)."""
        self._pool = pool
        self._billing = billing
        self._attempts = attempts
        self._relay = relay
        self._tracing = tracing
        self._inflight = inflight
        self._abandoned = abandoned

    # -- non-streamed -----------------------------------------------------------------------

    async def chat(
        self, run: Run, deployment: str, tier: TierFaults, *, last: bool = False
    ) -> ChatResponse:
        """``last``: no other deployment is left to try (no first-byte limit)."""
        started = time.time()
        server: str | None = None
        replica: str | None = None
        body = run.job.body
        sent = False
        try:
            async with self._pool.lease(deployment, affinity=run.job.conversation) as backend:
                replica = backend.name
                server = backend.address if self._tracing.enabled else None
                request = self._request(run.job, body, deployment, started, tier, last)
                if self._external(deployment):
                    await self._attempts.calling(run, deployment, started)
                async with self._inflight.watching(deployment):  # ended if it is drained
                    sent = True
                    response = await backend.chat(request)
        except asyncio.CancelledError:
            why = self._why_cancelled(run, "call")
            usage, guess = self._unanswered(deployment, body, "cancelled", sent=sent)
            self._attempts.record(
                run, deployment, "cancelled", started, usage, why, server=server, estimated=guess
            )
            self._attempts.unjudged(deployment, replica)
            raise
        except BackendError as exc:
            usage, guess = self._unanswered(
                deployment, body, exc.kind, sent=sent, unreadable=unreadable(exc)
            )
            if await self._attempts.failed(
                run, deployment, exc, started, usage, server=server, estimated=guess,
                backend_fault=not cut_by_deadline(exc, run.job, tier, started), replica=replica,
            ):  # fmt: skip
                raise Tripped(exc) from exc
            raise
        usage, guess = response.usage, False
        if usage is None:  # an answer without usage is billed all the same
            usage, guess = estimate(body, output_text(response.body)), True
        self._attempts.record(
            run, deployment, "ok", started, usage, None, server=server, estimated=guess
        )
        await self._attempts.succeeded(deployment, replica)
        return response

    def _unanswered(
        self,
        deployment: str,
        body: Mapping[str, Any],
        outcome: str,
        *,
        sent: bool,
        unreadable: bool = False,
    ) -> tuple[Usage | None, bool]:
        """What a non-streamed call that got no answer it could read is booked, and whether it
        is an estimate: nothing, unless its provider bills it anyway (``estimates``): the
        prompt estimate, and no completion (unknown)."""
        external = self._external(deployment)
        billed = billed_without_usage(
            outcome, external=external, sent=sent, answered=False, unreadable=unreadable
        )
        if billed:
            return estimate(body), True
        return None, False

    # -- streamed ---------------------------------------------------------------------------

    async def stream(
        self,
        run: Run,
        emit: Emit,
        deployment: str,
        tier: TierFaults,
        body: Mapping[str, Any],
        delivered: Delivered,
        *,
        last: bool = False,
    ) -> None:
        """``last``: no other deployment is left to try (no first-token or stall limit)."""
        job = run.job
        started = run.attempt_at = time.time()
        got = Streamed(body, external=self._external(deployment))
        resumed = run.ttft_at is not None
        server: str | None = None
        replica: str | None = None
        try:
            async with (
                self._pool.lease(deployment, affinity=run.job.conversation) as backend,
                contextlib.aclosing(
                    self._open(backend, job, body, deployment, started, tier, last)
                ) as it,
            ):
                replica = backend.name
                server = backend.address if self._tracing.enabled else None
                if got.external:
                    await self._attempts.calling(run, deployment, started)
                await self._relay.relay(run, emit, deployment, it, delivered, got)
        except asyncio.CancelledError:
            # What it delivered before the call was aborted.
            why = self._why_cancelled(run, "stream")
            usage, guess = got.billed("cancelled")
            self._attempts.record(
                run, deployment, "cancelled", started, usage, why,
                server=server, resumed=resumed, estimated=guess,
            )  # fmt: skip
            self._attempts.unjudged(deployment, replica)
            raise
        except BackendError as exc:
            usage, guess = got.billed(exc.kind, unreadable=unreadable(exc))
            tripped = await self._attempts.failed(
                run, deployment, exc, started, usage,
                server=server, resumed=resumed, estimated=guess,
                backend_fault=not cut_by_deadline(exc, job, tier, started, first=not got.received),
                replica=replica,
            )  # fmt: skip
            if got.sent:
                raise MidStream(exc) from exc
            if tripped:
                raise Tripped(exc) from exc
            raise
        usage, guess = got.billed("ok")
        self._attempts.record(
            run, deployment, "ok", started, usage, None,
            server=server, resumed=resumed, estimated=guess,
        )  # fmt: skip
        await self._attempts.succeeded(deployment, replica)

    def _open(
        self,
        backend: Backend,
        job: Job,
        body: Mapping[str, Any],
        deployment: str,
        started: float,
        tier: TierFaults,
        last: bool,
    ) -> Any:
        return backend.stream(self._request(job, body, deployment, started, tier, last))

    # -- shared -----------------------------------------------------------------------------

    def _why_cancelled(self, run: Run, what: str) -> str:
        """A call is cancelled because its client went away, or the worker is shutting down."""
        if run.job.request_id in self._abandoned:
            return f"cancelled during the {what}"
        return f"handed back at shutdown during the {what}"

    def _external(self, deployment: str) -> bool:
        """Served by a hosted API, which bills us (``DeploymentSpec.external``)."""
        return self._billing.external(deployment)

    def _request(
        self,
        job: Job,
        body: Mapping[str, Any],
        deployment: str,
        now: float,
        tier: TierFaults,
        last: bool,
    ) -> ChatRequest:
        """The call: held to the tier's per-attempt budget and the deadline; its wait for a
        first output to a share of the time left while others are left to try
        (``TierFaults.first_wait``). The body goes without the fields the plan does not send
        ``deployment`` (``RoutePlan.dropped``: hints it cannot take)."""
        dropped = job.plan.dropped_for(deployment)
        if dropped:
            body = {k: v for k, v in body.items() if k not in dropped}
        return ChatRequest(  # a stream's usage is asked for by every adapter
            model=deployment,
            body=body,
            request_id=job.request_id,
            timeout_s=max(min(tier.attempt_s, job.deadline - now), 0.001),
            endpoint="embeddings" if job.endpoint == "embeddings" else "chat",
            first_token_s=tier.first_wait(
                stream=job.stream, time_left=job.deadline - now, last=last
            ),
            stall_s=tier.stall(last=last),
        )
