"""Turning worker replies into HTTP: a JSON response, or an SSE stream that starts with its
first chunk (so routing headers are known) and carries cost and overhead in its final chunk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi.responses import Response
from starlette.background import BackgroundTask

from gateway.api.shapes import CHAT, Shape
from gateway.api.sse import EventStreamResponse
from gateway.api.timing import StageClock
from gateway.errors import GatewayError, UpstreamFailed
from gateway.observability.logging import log_request
from gateway.parts import Services
from gateway.queue.jobs import Reply
from gateway.reply_meta import ReplyMeta

__all__ = ["RelayContext", "json_response", "sse_response"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayContext:
    """What the relay needs to know about the request it answers."""

    services: Services
    request_id: str
    started: float
    rule: str
    wants_usage: bool
    tenant: str = ""
    planned: str | None = None
    """The plan's first deployment (serving another one is a fallback)."""
    prompt: Any = None
    """Logged with the access line only when ``logging.log_prompts`` is on."""
    clock: StageClock | None = None
    """Stage times for the ``Server-Timing`` header (a stream's: up to its first chunk)."""
    shape: Shape = CHAT
    """The wire the client speaks: chat's, or an endpoint's built on it (``shapes``)."""
    dropped: Callable[[str | None], tuple[str, ...]] | None = None
    """The body fields a deployment was not sent (``RoutePlan.dropped_for``)."""

    def headers(self, meta: ReplyMeta) -> dict[str, str]:
        headers = {
            "x-request-id": self.request_id,
            "x-tiergate-tier": meta.tier or "",
            "x-tiergate-model": meta.deployment or "",
            "x-tiergate-rule": self.rule,
            "x-tiergate-queue-ms": f"{meta.queue_ms:.1f}",
        }
        if meta.downgraded:
            headers["x-tiergate-downgraded"] = "true"  # served below the planned tier
        dropped = () if self.dropped is None else self.dropped(meta.deployment)
        if dropped:  # hints (reasoning parameters) the deployment that answered was not sent
            headers["x-tiergate-dropped"] = ", ".join(dropped)
        return headers

    def stream_headers(self, meta: ReplyMeta) -> dict[str, str]:
        """A stream's headers, sent with its first chunk (``meta``: that chunk's)."""
        headers = {**self.headers(meta), "cache-control": "no-cache"}
        if self.clock is not None:
            headers["server-timing"] = self.clock.header(meta)  # up to the first chunk
        return headers

    def overhead_ms(self, meta: ReplyMeta, at: float | None = None) -> float:
        """Time in the gateway up to ``at`` (default now), less queue wait, backend time and
        the waits between retries (a backend's ``Retry-After``, backoff)."""
        total_ms = ((time.perf_counter() if at is None else at) - self.started) * 1000
        outside = meta.queue_ms + (meta.backend_ms or 0.0) + meta.wait_ms
        return max(total_ms - outside, 0.0)

    def x_tiergate(self, meta: ReplyMeta) -> dict[str, Any]:
        """A stream's closing figures. ``model`` and ``tier`` are the ones its headers named
        (the deployment that began the answer); ``served_by`` lists every deployment that
        wrote part of it, when another one continued it."""
        served = list(meta.served_by)
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "tier": meta.tier,
            "model": served[0] if served else meta.deployment,
            "rule": self.rule,
            "cost_usd": meta.cost_text,
            "overhead_ms": round(self.overhead_ms(meta), 3),
            "queue_ms": round(meta.queue_ms, 3),
        }
        if len(served) > 1:
            out["served_by"] = served
        return out

    def observe(self, meta: ReplyMeta, outcome: str, stream: bool, at: float | None = None) -> None:
        """Metrics, the access line and the trace of the answer, as of ``at`` (a
        ``perf_counter`` reading: when the answer was complete; default now)."""
        metrics = self.services.metrics
        tier = meta.tier or "none"
        deployment = meta.deployment or "none"
        at = time.perf_counter() if at is None else at
        elapsed = at - self.started
        overhead_ms = self.overhead_ms(meta, at)
        metrics.requests.labels(self.tenant, tier, deployment, outcome).inc()
        metrics.latency.labels(tier, deployment, str(stream).lower()).observe(elapsed)
        metrics.overhead.observe(overhead_ms / 1000)
        metrics.queue_wait.labels(tier).observe(meta.queue_ms / 1000)
        prompt_tokens = meta.prompt_tokens
        completion_tokens = meta.completion_tokens
        metrics.tokens.labels(self.tenant, tier, "prompt").inc(prompt_tokens)
        metrics.tokens.labels(self.tenant, tier, "completion").inc(completion_tokens)
        cost = meta.cost_usd
        if cost is not None:
            metrics.cost.labels(self.tenant, tier, deployment).inc(float(cost))
        elif prompt_tokens or completion_tokens:
            metrics.unknown_price.labels(self.tenant, deployment).inc()
        if self.planned and meta.deployment and deployment != self.planned:
            metrics.fallbacks.labels(tier, self.planned, deployment).inc()
        fields = {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "tier": tier,
            "deployment": deployment,
            "rule": self.rule,
            "outcome": outcome,
            "stream": stream,
            "latency_ms": round(elapsed * 1000, 3),
            "queue_ms": round(meta.queue_ms, 3),
            "overhead_ms": round(overhead_ms, 3),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cost_usd": meta.cost_text,
        }
        log_request(fields, prompt=self.prompt)
        self.services.tracing.answered(meta, outcome, stream)

    def observe_first_chunk(self, meta: ReplyMeta) -> None:
        tier = meta.tier or "none"
        deployment = meta.deployment or "none"
        self.services.metrics.ttft.labels(tier, deployment).observe(
            time.perf_counter() - self.started
        )


class RelayedError(Exception):
    """An error the worker already booked: the edge only answers it."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.message)
        self.error = error


def json_response(ctx: RelayContext, reply: Reply) -> Response:
    if reply.kind == "error":
        error = reply.error()
        ctx.observe(reply.meta, error.outcome, stream=False)
        raise RelayedError(error)
    meta = reply.meta
    headers = ctx.headers(meta)
    cost = meta.cost_text
    headers["x-tiergate-cost-usd"] = "unknown" if cost is None else cost
    at = time.perf_counter()
    headers["x-tiergate-overhead-ms"] = f"{ctx.overhead_ms(meta, at):.3f}"
    if ctx.clock is not None:
        headers["server-timing"] = ctx.clock.header(meta)
    # Metrics, access line and trace after the body is sent (off the answer's latency), as of
    # now: in the same turn of the event loop as the send, so before anything the client does
    # next is handled.
    return Response(
        orjson.dumps(ctx.shape.answer(reply.data)),
        media_type="application/json",
        headers=headers,
        background=BackgroundTask(_observe_after, ctx, meta, at),
    )


async def _observe_after(ctx: RelayContext, meta: ReplyMeta, at: float) -> None:
    ctx.observe(meta, "ok", stream=False, at=at)


def _is_final_candidate(chunk: Mapping[str, Any]) -> bool:
    choices = chunk.get("choices") or []
    return not choices or any(c.get("finish_reason") for c in choices)


class _StreamRelay:
    """Chunks pass straight through, except the final-candidate chunk (``finish_reason`` set, or
    the usage chunk), which is held until the worker's ``end`` event brings cost and overhead."""

    def __init__(self, ctx: RelayContext, route: ReplyMeta) -> None:
        self.ctx = ctx
        self.route = route
        self.out = ctx.shape.stream(ctx.request_id)
        self.held: dict[str, Any] | None = None
        self.finished = False
        self.last_chunk_at: float | None = None
        self.itl = ctx.services.metrics.itl.labels(route.tier or "none", route.deployment or "none")

    def _gap(self) -> None:
        now = time.perf_counter()
        if self.last_chunk_at is not None:
            self.itl.observe(now - self.last_chunk_at)
        self.last_chunk_at = now

    def _flush(self, extra: dict[str, Any] | None = None) -> list[bytes]:
        if self.held is None:
            return []
        held = {**self.held, **extra} if extra else self.held
        self.held = None
        return self.out.chunk(held)

    def on_reply(self, reply: Reply) -> list[bytes]:
        if reply.kind == "chunk":
            self._gap()
            chunk = reply.data
            if not chunk.get("choices") and "usage" in chunk and not self.ctx.wants_usage:
                return []  # usage was asked for billing only
            if _is_final_candidate(chunk):
                out = self._flush()
                self.held = chunk
                return out
            return self.out.chunk(chunk)
        self.finished = True
        if reply.kind == "end":
            meta = reply.meta.over(self.route)
            self.ctx.observe(meta, "ok", stream=True)
            shown = self.ctx.x_tiergate(self._as_headed(meta))
            return [*self._flush({"x_tiergate": shown}), *self.out.end()]
        return [*self._flush(), *self._error(reply.data, reply.meta)]

    def on_failure(self, error: GatewayError) -> list[bytes]:
        self.finished = True
        return [*self._flush(), *self._error(error.body(), ReplyMeta())]

    def _as_headed(self, meta: ReplyMeta) -> ReplyMeta:
        """``meta`` with the tier the stream's headers named."""
        return meta if self.route.tier is None else replace(meta, tier=self.route.tier)

    def _error(self, error: Mapping[str, Any], meta: ReplyMeta) -> list[bytes]:
        """A chunk with a non-success finish_reason, then an error event (the SDK raises on
        it), in the client's wire."""
        merged = meta.over(self.route)
        self.ctx.observe(merged, "stream_error", stream=True)
        closing = {
            "id": self.ctx.request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.route.deployment,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
            "x_tiergate": self.ctx.x_tiergate(self._as_headed(merged)),
        }
        return self.out.error(closing, error)


async def sse_response(
    ctx: RelayContext,
    first: Reply,
    replies: AsyncIterator[Reply],
    *,
    on_gone: Callable[[], None] | None = None,
) -> Response:
    """``first`` is the stream's first reply (already awaited, so headers are known);
    ``on_gone`` is called when the client disconnects before the stream's end."""
    if first.kind == "error":
        error = first.error()
        ctx.observe(first.meta, error.outcome, stream=True)
        raise RelayedError(error)
    relay = _StreamRelay(ctx, first.meta)
    ctx.observe_first_chunk(first.meta)
    opening = b"".join(relay.on_reply(first))

    async def rest() -> AsyncIterator[bytes]:
        if relay.finished:
            return
        try:
            async for reply in replies:
                for event in relay.on_reply(reply):
                    yield event
                if relay.finished:
                    return
            # The reply channel ended without an end event: say so, never end cleanly.
            for event in relay.on_failure(UpstreamFailed("the stream ended unexpectedly")):
                yield event
        except GatewayError as exc:
            for event in relay.on_failure(exc):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            if on_gone is not None and not relay.finished:
                on_gone()  # the client went away: stop generating
            raise

    return EventStreamResponse(opening, rest(), headers=ctx.stream_headers(first.meta))
