"""OpenTelemetry traces: edge → route → queue → worker → backend attempts → ledger.

One ``Tracing`` per running service (built by ``open_services``, flushed when it closes): its
own SDK ``TracerProvider``, sampler and OTLP/HTTP exporter. Nothing is set globally — no
``trace.set_tracer_provider`` — so two services in one process (tests) never share spans. Only
the *current span* travels implicitly, in OpenTelemetry's context variable, the way asyncio
copies it into the tasks a request starts.

Off (the default), ``Tracing.off()`` answers every hook at once: no middleware is installed, no
span, attribute dict or context object is made, and jobs carry no ``traceparent``.

Spans (docs/observability.md#traces):

- ``chat.completions`` (edge, SERVER): one per ``POST /v1/chat/completions``, continuing the
  caller's ``traceparent`` when it sends one; ends when the last byte is handed over.
- ``route`` (edge): the routing decision, recorded after the fact from its measured time.
- ``queue.wait`` (worker): from the edge's enqueue to the worker taking the job.
- ``job`` (worker, CONSUMER): the executor running the plan; its children are one
  ``backend.attempt`` (CLIENT) per backend call or breaker skip.
- ``ledger.write``: the ledger entry going to the event stream (or SQL).

The worker may be another process: the edge puts the W3C ``traceparent`` of its request span in
the ``Job``; the worker adopts it for the task that runs the job. Attributes carry identifiers,
routing and token counts only — never prompt or answer text, never keys, never backend error
messages (they can quote the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.faults.chains import DOWNGRADE_TAG
from gateway.settings import TracingSettings, read_secret

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from gateway.accounting.records import LedgerEntry
    from gateway.errors import GatewayError
    from gateway.queue.jobs import Job
    from gateway.reply_meta import ReplyMeta
    from router.plan import RoutePlan

__all__ = ["CHAT_PATH", "Tracing", "TracingMiddleware", "note_error"]

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
_SCOPE = "tiergate"
_DEFAULT_SERVICE = "tiergate"
_PROPAGATOR = TraceContextTextMapPropagator()
"""Stateless (W3C Trace Context); shared by every ``Tracing``."""
_TRACE_HEADERS = (b"traceparent", b"tracestate")

# Attribute names. OpenTelemetry semantic conventions where they exist (HTTP: stable; GenAI:
# the names of the GenAI conventions, incubating, as listed by opentelemetry-semantic-conventions
# 0.66b2, where ``gen_ai.system`` is deprecated for ``gen_ai.provider.name``); ``tiergate.*``
# for the rest.
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
URL_PATH = "url.path"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_STREAM = "gen_ai.request.stream"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TENANT = "tiergate.tenant"
REQUEST_ID = "tiergate.request_id"
TIER = "tiergate.tier"
TIER_SERVED = "tiergate.tier.served"
RULE = "tiergate.rule"
SCORE = "tiergate.route.score"
PLAN = "tiergate.route.deployments"
OUTCOME = "tiergate.outcome"
ATTEMPT = "tiergate.attempt.number"
ATTEMPTS = "tiergate.attempts"
ATTEMPT_KIND = "tiergate.attempt.kind"
ATTEMPT_REASON = "tiergate.attempt.reason"
PRIORITY = "tiergate.priority"
COST = "tiergate.cost_usd"
ESTIMATED = "tiergate.usage.estimated"
ESTIMATED_COST = "tiergate.estimated_cost_usd"
DOWNGRADED = "tiergate.downgraded"
LEDGER_SINK = "tiergate.ledger.sink"


def _ns(unix_s: float) -> int:
    return int(unix_s * 1e9)


def _dropped() -> bool:
    """Whether the current trace was sampled out: with a parent-based sampler every span under
    it would be dropped, so none is made (the worker side of an unsampled request)."""
    context = trace.get_current_span().get_span_context()
    return context.is_valid and not context.trace_flags.sampled


def note_error(code: str) -> None:
    """Put the error code of the answer being sent on the current span (the edge's request
    span), if one is recording. Used by the one place errors become HTTP responses."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, code)


class Tracing:
    """One service's tracer (or none). Hooks are cheap no-ops when ``enabled`` is false."""

    __slots__ = ("_provider", "_tracer", "enabled")

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer: Tracer = provider.get_tracer(_SCOPE) if provider is not None else NoOpTracer()
        self.enabled = provider is not None

    # -- building and closing --------------------------------------------------------------

    @classmethod
    def off(cls) -> Tracing:
        return cls()

    @classmethod
    def from_settings(cls, settings: TracingSettings, *, instance_id: str) -> Tracing:
        """``Tracing.off()`` unless ``settings.enabled``; else batches spans to OTLP/HTTP."""
        if not settings.enabled:
            return cls.off()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        headers: dict[str, str] = {}
        for header, env_name in settings.headers_env.items():
            value = read_secret(env_name)
            if value is None:
                log.warning("tracing header %s: variable %s is unset; not sent", header, env_name)
            else:
                headers[header] = value
        exporter = OTLPSpanExporter(
            endpoint=_traces_url(settings.endpoint),
            headers=headers or None,
            timeout=settings.export_timeout_s,
        )
        return cls.with_exporter(
            exporter,
            sample_ratio=settings.sample_ratio,
            service_name=settings.service_name,
            instance_id=instance_id,
            batch=True,
            max_queue_size=settings.max_queue_size,
        )

    @classmethod
    def with_exporter(
        cls,
        exporter: SpanExporter,
        *,
        sample_ratio: float = 1.0,
        service_name: str | None = None,
        instance_id: str | None = None,
        batch: bool = True,
        max_queue_size: int = 2048,
    ) -> Tracing:
        """A provider of its own exporting to ``exporter`` (tests pass an in-memory one with
        ``batch=False``: each span is exported when it ends)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        attributes: dict[str, str] = {
            "service.name": service_name or os.environ.get("OTEL_SERVICE_NAME") or _DEFAULT_SERVICE,
        }
        if instance_id:
            attributes["service.instance.id"] = instance_id
        provider = SdkProvider(
            sampler=ParentBased(root=TraceIdRatioBased(sample_ratio)),
            resource=Resource.create(attributes),
        )
        processor: SpanProcessor = (
            BatchSpanProcessor(exporter, max_queue_size=max_queue_size)
            if batch
            else SimpleSpanProcessor(exporter)
        )
        provider.add_span_processor(processor)
        return cls(provider)

    def flush(self, timeout_ms: int = 30_000) -> bool:
        return self._provider.force_flush(timeout_ms) if self._provider is not None else True

    async def aclose(self) -> None:
        """Export what is pending and stop the exporter (off the event loop: it may wait for
        the collector up to its export timeout)."""
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)

    # -- the edge ---------------------------------------------------------------------------

    def start_request(self, scope: Scope) -> Span:
        """The request span of a chat completion, child of the caller's ``traceparent``."""
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in _TRACE_HEADERS
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        return self._tracer.start_span(
            "chat.completions",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                HTTP_METHOD: str(scope.get("method", "")),
                HTTP_ROUTE: CHAT_PATH,
                URL_PATH: CHAT_PATH,
                GEN_AI_OPERATION: "chat",
            },
        )

    @staticmethod
    def end_request(span: Span, status: int, request_id: str | None) -> None:
        if span.is_recording():
            span.set_attributes(
                {HTTP_STATUS: status, REQUEST_ID: request_id}
                if request_id
                else {HTTP_STATUS: status}
            )
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    def routed(self, tenant: str, plan: RoutePlan, seconds: float) -> None:
        """The routing decision just made (it took ``seconds``): a ``route`` span, and the plan
        on the request span."""
        if not self.enabled:
            return
        request = trace.get_current_span()
        if not request.is_recording():
            return
        request.set_attributes(
            {
                TENANT: tenant,
                TIER: plan.tier.value,
                RULE: plan.rule,
                GEN_AI_REQUEST_MODEL: plan.requested_model,
            }
        )
        end = time.time_ns()
        attributes: dict[str, Any] = {
            TIER: plan.tier.value,
            RULE: plan.rule,
            PLAN: list(plan.deployments),
        }
        if plan.score is not None:
            attributes[SCORE] = plan.score
        span = self._tracer.start_span(
            "route", start_time=end - int(seconds * 1e9), attributes=attributes
        )
        span.end(end_time=end)

    def traceparent(self) -> str | None:
        """The current span's W3C ``traceparent`` (for the job), or ``None`` when off."""
        if not self.enabled:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier.get("traceparent")

    def answered(self, meta: ReplyMeta, outcome: str, stream: bool) -> None:
        """The relay's account of an answered request, on the request span."""
        if not self.enabled:
            return
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {
            GEN_AI_STREAM: stream,
            GEN_AI_INPUT_TOKENS: meta.prompt_tokens,
            GEN_AI_OUTPUT_TOKENS: meta.completion_tokens,
        }
        if meta.deployment:
            attributes[GEN_AI_RESPONSE_MODEL] = meta.deployment
            attributes[TIER_SERVED] = meta.tier or ""
        if meta.cost_text is not None:
            attributes[COST] = meta.cost_text
        if outcome != "ok":
            attributes[ERROR_TYPE] = outcome
        span.set_attributes(attributes)
        if outcome == "stream_error":
            span.set_status(Status(StatusCode.ERROR, "the stream broke"))

    def refused(
        self, error: GatewayError, *, tenant: str, requested_model: str, stream: bool
    ) -> None:
        """A request the edge refused itself (booked by ``book_refusal``)."""
        if not self.enabled:
            return
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {TENANT: tenant, GEN_AI_STREAM: stream, ERROR_TYPE: error.code}
        if requested_model:
            attributes[GEN_AI_REQUEST_MODEL] = requested_model
        span.set_attributes(attributes)

    # -- the worker -------------------------------------------------------------------------

    def adopt(self, job: Job) -> None:
        """Make the job's trace (its ``traceparent``) current for the rest of this task.

        Call it only in a task of the job's own (the worker runs each job in one): the context
        set here ends with that task, so it is not detached."""
        if not self.enabled or not job.traceparent:
            return
        otel_context.attach(_PROPAGATOR.extract({"traceparent": job.traceparent}))

    @contextlib.contextmanager
    def job(self, job: Job) -> Iterator[Span | None]:
        """``queue.wait`` (enqueue → now), then the ``job`` span, current while it runs."""
        if not self.enabled or _dropped():
            yield None
            return
        now = time.time_ns()
        tier = job.plan.tier.value
        wait = self._tracer.start_span(
            "queue.wait",
            start_time=min(_ns(job.enqueued_at), now),
            attributes={TIER: tier, PRIORITY: job.priority},
        )
        wait.end(end_time=now)
        span = self._tracer.start_span(
            "job",
            kind=SpanKind.CONSUMER,
            start_time=now,
            attributes={REQUEST_ID: job.request_id, TIER: tier, GEN_AI_STREAM: job.stream},
        )
        with _current(span):
            yield span

    @staticmethod
    def job_done(span: Span | None, entry: LedgerEntry) -> None:
        if span is None or not span.is_recording():
            return
        attributes: dict[str, Any] = {OUTCOME: entry.outcome, ATTEMPTS: len(entry.attempts)}
        if entry.deployment:
            attributes[GEN_AI_RESPONSE_MODEL] = entry.deployment
        if entry.outcome != "ok":
            attributes[ERROR_TYPE] = entry.outcome
            span.set_status(Status(StatusCode.ERROR))
        if DOWNGRADE_TAG in entry.tags:
            attributes[DOWNGRADED] = True
        if entry.usage_estimated:
            attributes[ESTIMATED] = True
        span.set_attributes(attributes)

    def attempt(
        self,
        *,
        deployment: str,
        provider: str,
        number: int,
        kind: str,
        reason: str | None,
        outcome: str,
        started: float,
        ended: float,
        server: str | None,
        input_tokens: int,
        output_tokens: int,
        estimated: bool = False,
    ) -> None:
        """One backend call (or breaker skip) that took ``started``..``ended`` (Unix s), as a
        child of the current (``job``) span. ``estimated``: its tokens are the gateway's
        estimate (``gateway.accounting.estimates``), not the backend's count."""
        if not self.enabled or _dropped():
            return
        attributes: dict[str, Any] = {
            GEN_AI_OPERATION: "chat",
            GEN_AI_PROVIDER: provider,
            GEN_AI_REQUEST_MODEL: deployment,
            ATTEMPT: number,
            ATTEMPT_KIND: kind,
            OUTCOME: outcome,
            ESTIMATED: estimated,
        }
        if input_tokens or output_tokens:
            attributes[GEN_AI_INPUT_TOKENS] = input_tokens
            attributes[GEN_AI_OUTPUT_TOKENS] = output_tokens
        if reason:
            attributes[ATTEMPT_REASON] = reason
        if server:
            host, _, port = server.rpartition(":")
            attributes[SERVER_ADDRESS] = host or server
            if port.isdigit():
                attributes[SERVER_PORT] = int(port)
        if outcome != "ok":
            attributes[ERROR_TYPE] = outcome
        span = self._tracer.start_span(
            "backend.attempt", kind=SpanKind.CLIENT, start_time=_ns(started), attributes=attributes
        )
        if outcome != "ok":
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=max(_ns(ended), _ns(started)))

    async def ledger_write(
        self, entry: LedgerEntry, write: Callable[[LedgerEntry], Awaitable[str]]
    ) -> None:
        """``write(entry)`` in a ``ledger.write`` span; it returns where the entry went
        (``stream`` or ``sql``, the span's ``tiergate.ledger.sink``). The span says whether the
        entry rests in part on estimated usage (``tiergate.usage.estimated``) and, if so, the
        cost priced from the estimates (``tiergate.estimated_cost_usd``)."""
        if not self.enabled or _dropped():
            await write(entry)
            return
        attributes: dict[str, Any] = {ESTIMATED: entry.usage_estimated}
        if entry.estimated_micro_usd is not None:
            attributes[ESTIMATED_COST] = str(entry.estimated_usd)
        span = self._tracer.start_span("ledger.write", attributes=attributes)
        with _current(span):
            sink = await write(entry)
            span.set_attribute(LEDGER_SINK, sink)


@contextlib.contextmanager
def _current(span: Span) -> Iterator[None]:
    """``span`` current while the block runs, ended after it. An exception marks it failed
    with its type only (messages may quote the request: no ``record_exception``)."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        if span.is_recording():
            span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _traces_url(endpoint: str | None) -> str | None:
    """The OTLP/HTTP traces URL of a collector's base URL (``http://collector:4318``);
    ``None`` leaves it to ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (default ``http://localhost:4318``)."""
    if endpoint is None:
        return None
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


class TracingMiddleware:
    """ASGI middleware: the ``chat.completions`` span around each chat completion request,
    current while the app handles it (streams included: it ends after the last chunk).

    Installed only when tracing is on; takes the ``Tracing`` from the app's services."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT_PATH:
            await self.app(scope, receive, send)
            return
        tracing: Tracing = scope["app"].state.services.tracing
        span = tracing.start_request(scope)
        token = otel_context.attach(trace.set_span_in_context(span))
        status = 500

        async def send_traced(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_traced)
        except BaseException as exc:
            if span.is_recording():
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            raise
        finally:
            state = scope.get("state") or {}
            tracing.end_request(span, status, state.get("request_id"))
            otel_context.detach(token)
