"""OpenTelemetry traces through the real stack: the public app in-process (httpx ASGI transport),
simulators as real HTTP servers, the real Redis queue, and the edge and the worker as two
separate services with their own tracer providers (as if two processes: only the job's
``traceparent`` in Redis joins their spans). Spans are caught by the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from backends.sim import PROFILES, create_sim_app
from gateway.app import create_app
from gateway.observability import tracing as tracing_module
from gateway.observability.tracing import Tracing, TracingMiddleware
from gateway.queue.running.direct import DIRECT_LANE
from gateway.services import Services, open_services
from gateway.settings import load_settings
from tests.support import free_port, gateway_config

SMALL, LARGE = "llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"
KEY = "dev-initech"  # initech: small and large tiers only
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@dataclass
class Traced:
    client: httpx.AsyncClient
    edge: InMemorySpanExporter
    worker: InMemorySpanExporter
    sim_ports: dict[str, int]
    services: Services

    def spans(self) -> list[ReadableSpan]:
        return [*self.edge.get_finished_spans(), *self.worker.get_finished_spans()]

    async def wait_for(self, name: str, count: int = 1, timeout_s: float = 10.0) -> None:
        """The worker books the ledger after it replied: its last spans may end after the
        response."""
        deadline = time.monotonic() + timeout_s
        while sum(s.name == name for s in self.spans()) < count:
            assert time.monotonic() < deadline, f"no {name} span: {names(self.spans())}"
            await asyncio.sleep(0.02)


def names(spans: Sequence[ReadableSpan]) -> list[str]:
    return [s.name for s in spans]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {names(spans)}"
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@contextlib.asynccontextmanager
async def sims(*profiles: str) -> AsyncIterator[dict[str, int]]:
    runners: list[web.AppRunner] = []
    ports: dict[str, int] = {}
    try:
        for profile in profiles:
            runner = web.AppRunner(create_sim_app(PROFILES[profile], time_scale=0.0))
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            ports[profile] = port
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


def config_file(tmp_path: Path, redis_url: str, key_prefix: str, ports: dict[str, int]) -> Path:
    """The example config on the test's Redis prefix, SQLite and simulators."""
    return gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}",
        sim_ports=ports,
        port=free_port(),
        admin_port=free_port(),
    )


@contextlib.asynccontextmanager
async def traced_stack(
    tmp_path: Path, redis_url: str, key_prefix: str, *, sample_ratio: float = 1.0
) -> AsyncIterator[Traced]:
    async with sims(SMALL, LARGE) as ports:
        path = config_file(tmp_path, redis_url, key_prefix, ports)
        config = yaml.safe_load(path.read_text())
        config["fallback"]["tiers"]["small"]["retry"].update(
            backoff_initial_s=0.01, backoff_max_s=0.02, jitter_s=0.0
        )
        config["fallback"]["breaker"]["health_interval_s"] = 0
        path.write_text(yaml.safe_dump(config))
        settings = load_settings(path)
        edge_spans, worker_spans = InMemorySpanExporter(), InMemorySpanExporter()
        edge_tracing = Tracing.with_exporter(
            edge_spans, sample_ratio=sample_ratio, instance_id="edge", batch=False
        )
        worker_tracing = Tracing.with_exporter(
            worker_spans, sample_ratio=sample_ratio, instance_id="worker", batch=False
        )
        try:
            async with (
                open_services(settings, dev=True, workers=True, tracing=worker_tracing),
                open_services(settings, dev=True, workers=False, tracing=edge_tracing) as edge,
            ):
                app = create_app(services=edge)
                app.state.services = edge
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://tiergate", timeout=30
                ) as client:
                    yield Traced(client, edge_spans, worker_spans, ports, edge)
        finally:
            await edge_tracing.aclose()
            await worker_tracing.aclose()


@pytest.fixture
async def stack(tmp_path: Path, redis_url: str, key_prefix: str) -> AsyncIterator[Traced]:
    async with traced_stack(tmp_path, redis_url, key_prefix) as built:
        yield built


def chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "small", "messages": [{"role": "user", "content": prompt}], **extra}


def headers(**extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}", **extra}


def attribute_text(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute, event and resource value of ``spans``, as one string."""
    parts: list[str] = []
    for span in spans:
        parts.append(json.dumps(dict(span.attributes or {}), default=str))
        parts.append(json.dumps(dict(span.resource.attributes), default=str))
        parts.append(span.name)
        if span.status.description:
            parts.append(span.status.description)
        for event in span.events:
            parts.append(json.dumps(dict(event.attributes or {}), default=str))
    return "\n".join(parts)


async def test_span_tree_crosses_the_queue_and_continues_the_callers_trace(
    stack: Traced,
) -> None:
    prompt = f"private-prompt-{uuid.uuid4().hex}"
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    reply = await stack.client.post(
        "/v1/chat/completions", json=chat(prompt), headers=headers(traceparent=traceparent)
    )
    assert reply.status_code == 200, reply.text
    request_id = reply.headers["x-request-id"]
    answer = reply.json()["choices"][0]["message"]["content"]
    await stack.wait_for("ledger.write")

    edge, worker = stack.edge.get_finished_spans(), stack.worker.get_finished_spans()
    assert sorted(names(edge)) == ["chat.completions", "route"]
    assert sorted(names(worker)) == ["backend.attempt", "job", "ledger.write", "queue.wait"]
    spans = [*edge, *worker]
    assert {f"{s.context.trace_id:032x}" for s in spans} == {CLIENT_TRACE}

    request = one(spans, "chat.completions")
    assert request.kind is SpanKind.SERVER
    assert parent_of(request) == int(CLIENT_SPAN, 16)
    assert request.parent is not None and request.parent.is_remote
    root = request.context.span_id
    assert parent_of(one(spans, "route")) == root
    job = one(spans, "job")
    for name in ("queue.wait", "job", "ledger.write"):
        assert parent_of(one(spans, name)) == root, name
        assert one(spans, name).parent.is_remote  # via Redis
    attempt = one(spans, "backend.attempt")
    assert parent_of(attempt) == job.context.span_id
    assert attempt.kind is SpanKind.CLIENT

    attrs = dict(request.attributes or {})
    assert attrs["tiergate.tenant"] == "initech"
    assert attrs["tiergate.request_id"] == request_id
    assert attrs["tiergate.tier"] == "small"
    assert attrs["tiergate.rule"] == reply.headers["x-tiergate-rule"]
    assert attrs["gen_ai.request.model"] == "small"
    assert attrs["gen_ai.response.model"] == SMALL
    assert attrs["gen_ai.request.stream"] is False
    assert attrs["http.response.status_code"] == 200
    assert attrs["http.request.method"] == "POST"
    assert attrs["http.route"] == "/v1/chat/completions"
    usage = reply.json()["usage"]
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] > 0
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"] > 0
    assert "error.type" not in attrs

    route = dict(one(spans, "route").attributes or {})
    assert route["tiergate.tier"] == "small" and route["tiergate.rule"] == attrs["tiergate.rule"]
    assert tuple(route["tiergate.route.deployments"]) == (SMALL, LARGE)

    tried = dict(attempt.attributes or {})
    assert tried["gen_ai.request.model"] == SMALL
    assert tried["gen_ai.operation.name"] == "chat"
    assert tried["gen_ai.provider.name"] == "vllm"
    assert tried["server.address"] == "127.0.0.1"
    assert tried["server.port"] == stack.sim_ports[SMALL]
    assert tried["tiergate.attempt.number"] == 1
    assert tried["tiergate.attempt.kind"] == "first"
    assert tried["tiergate.outcome"] == "ok"
    assert tried["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert tried["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert tried["tiergate.usage.estimated"] is False  # the backend's own count
    assert "tiergate.usage.estimated" not in dict(job.attributes or {})
    assert attempt.start_time is not None and job.start_time is not None
    assert job.start_time <= attempt.start_time
    written = dict(one(spans, "ledger.write").attributes or {})
    assert written["tiergate.ledger.sink"] == "stream"
    assert written["tiergate.usage.estimated"] is False
    assert "tiergate.estimated_cost_usd" not in written
    wait = one(spans, "queue.wait")
    assert wait.end_time is not None and wait.start_time is not None
    assert wait.end_time >= wait.start_time

    text = attribute_text(spans)
    for secret in (prompt, answer, KEY, "dev-"):
        assert secret not in text


async def test_stream_fallback_attempts_and_a_new_trace(stack: Traced) -> None:
    """No caller trace: the edge starts one. The small deployment answers 503: retried once,
    then the large tier serves; each attempt is a span with its kind and reason."""
    async with httpx.AsyncClient() as admin:
        faults = await admin.post(
            f"http://127.0.0.1:{stack.sim_ports[SMALL]}/admin/faults", json={"error_status": 503}
        )
        assert faults.status_code == 200
    prompt = f"streamed-secret-{uuid.uuid4().hex}"
    async with stack.client.stream(
        "POST",
        "/v1/chat/completions",
        json=chat(prompt, stream=True, stream_options={"include_usage": True}),
        headers=headers(),
    ) as reply:
        assert reply.status_code == 200
        body = "".join([part async for part in reply.aiter_text()])
    assert "data: [DONE]" in body
    await stack.wait_for("ledger.write")
    spans = stack.spans()
    assert len({s.context.trace_id for s in spans}) == 1
    request = one(spans, "chat.completions")
    assert request.parent is None
    attrs = dict(request.attributes or {})
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["tiergate.tier"] == "small"
    assert attrs["tiergate.tier.served"] == "large"
    assert attrs["gen_ai.response.model"] == LARGE
    assert int(attrs["gen_ai.usage.output_tokens"]) > 0
    assert request.end_time is not None

    job = one(spans, "job")
    attempts = sorted(
        (s for s in spans if s.name == "backend.attempt"),
        key=lambda s: int((s.attributes or {})["tiergate.attempt.number"]),
    )
    seen = [
        (
            a.attributes["gen_ai.request.model"],
            a.attributes["tiergate.attempt.kind"],
            a.attributes.get("tiergate.attempt.reason"),
            a.attributes["tiergate.outcome"],
        )
        for a in attempts
    ]
    assert seen == [
        (SMALL, "first", None, "unavailable"),
        (SMALL, "retry", "unavailable", "unavailable"),
        (LARGE, "fallback", "unavailable", "ok"),
    ]
    assert all(parent_of(a) == job.context.span_id for a in attempts)
    assert attempts[0].attributes["error.type"] == "unavailable"
    assert attempts[2].attributes["server.port"] == stack.sim_ports[LARGE]
    assert dict(job.attributes or {})["tiergate.attempts"] == 3
    # the request span ends with the stream, after the attempt that served it
    assert request.end_time >= max(a.end_time or 0 for a in attempts)
    assert prompt not in attribute_text(spans)


async def test_refusals_carry_the_error_code(stack: Traced) -> None:
    bad = await stack.client.post(
        "/v1/chat/completions", json={"model": "small", "messages": []}, headers=headers()
    )
    assert bad.status_code == 400
    unknown = await stack.client.post(
        "/v1/chat/completions", json=chat("hi"), headers={"authorization": "Bearer sk-nope"}
    )
    assert unknown.status_code == 401
    spans = stack.edge.get_finished_spans()
    # the refusal is booked by the edge (its ledger.write); the unauthenticated one is not
    assert names(spans) == ["ledger.write", "chat.completions", "chat.completions"]
    booked, first, second = spans
    assert parent_of(booked) == first.context.span_id
    refused, unauthenticated = dict(first.attributes or {}), dict(second.attributes or {})
    assert refused["http.response.status_code"] == 400
    assert refused["error.type"] == "invalid_request"
    assert refused["tiergate.tenant"] == "initech"
    assert refused["tiergate.request_id"] == bad.headers["x-request-id"]
    assert unauthenticated["http.response.status_code"] == 401
    assert unauthenticated["error.type"] == "invalid_api_key"
    assert "sk-nope" not in attribute_text(spans)
    assert stack.worker.get_finished_spans() == ()  # nothing was queued


async def test_sampling_is_parent_based(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    """Ratio 0: a request of its own is not recorded, on the edge nor in the worker; a caller
    whose traceparent says "sampled" is."""
    async with traced_stack(tmp_path, redis_url, key_prefix, sample_ratio=0.0) as stack:
        plain = await stack.client.post("/v1/chat/completions", json=chat("a"), headers=headers())
        assert plain.status_code == 200
        sampled = await stack.client.post(
            "/v1/chat/completions",
            json=chat("b"),
            headers=headers(traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
        )
        assert sampled.status_code == 200
        await stack.wait_for("ledger.write")
        await asyncio.sleep(0.2)  # the unsampled job's worker side, had it made spans
        spans = stack.spans()
        assert {f"{s.context.trace_id:032x}" for s in spans} == {CLIENT_TRACE}
        assert names(spans).count("chat.completions") == 1
        assert names(spans).count("job") == 1


async def test_off_means_no_middleware_and_no_traceparent(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    async with sims(SMALL) as ports:
        path = config_file(tmp_path, redis_url, key_prefix, ports)
        settings = load_settings(path)
        assert settings.tracing.enabled is False
        async with open_services(settings, dev=True, workers=False) as services:
            assert services.tracing.enabled is False
            app = create_app(services=services)
            assert all(m.cls is not TracingMiddleware for m in app.user_middleware)
            assert services.tracing.traceparent() is None
        traced = settings.model_copy(
            update={"tracing": settings.tracing.model_copy(update={"enabled": True})}
        )
        assert any(m.cls is TracingMiddleware for m in create_app(traced).user_middleware)


def test_attribute_names_follow_the_pinned_semantic_conventions() -> None:
    """Every ``gen_ai.*``, ``http.*``, ``server.*``, ``url.*`` and ``error.*`` name the
    tracing module writes is one the pinned opentelemetry-semantic-conventions defines."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
    from opentelemetry.semconv.attributes import (
        error_attributes,
        http_attributes,
        server_attributes,
        url_attributes,
    )

    known = {
        value
        for module in (
            gen_ai_attributes,
            error_attributes,
            http_attributes,
            server_attributes,
            url_attributes,
        )
        for value in vars(module).values()
        if isinstance(value, str)
    }
    ours = {
        value
        for name, value in vars(tracing_module).items()
        if name.isupper() and isinstance(value, str) and "." in value
    }
    standard = {v for v in ours if v.split(".")[0] in {"gen_ai", "http", "server", "url", "error"}}
    assert standard, ours
    assert standard <= known, standard - known
    assert "gen_ai.system" not in ours  # deprecated for gen_ai.provider.name in this version


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_service_name_defaults_and_env(no_otel_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def service_name(**kwargs: Any) -> str:
        exporter = InMemorySpanExporter()
        tracing = Tracing.with_exporter(exporter, batch=False, **kwargs)
        now = time.time()
        tracing.attempt(
            deployment=SMALL, provider="vllm", number=1, kind="first", reason=None,
            outcome="ok", started=now, ended=now, server=None, input_tokens=1, output_tokens=1,
        )  # fmt: skip
        (span,) = exporter.get_finished_spans()
        return str(span.resource.attributes["service.name"])

    assert service_name() == "tiergate"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-eu")
    assert service_name() == "gateway-eu"
    assert service_name(service_name="mine") == "mine"


async def test_direct_start_in_the_edges_own_worker_keeps_the_tree(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """Edge and worker in one service (``tiergate serve``): an idle tier starts the job at once
    in this process (no reply stream); its spans still hang under the request span."""
    async with sims(SMALL) as ports:
        path = config_file(tmp_path, redis_url, key_prefix, ports)
        exporter = InMemorySpanExporter()
        tracing = Tracing.with_exporter(exporter, batch=False)
        async with open_services(load_settings(path), dev=True, tracing=tracing) as services:
            app = create_app(services=services)
            app.state.services = services
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                reply = await client.post(
                    "/v1/chat/completions", json=chat("hi"), headers=headers()
                )
            assert reply.status_code == 200, reply.text
            direct = services.redis_keys.jobs("small", DIRECT_LANE, "initech")
            assert await services.redis.sismember(services.redis_keys.streams("small"), direct)
            deadline = time.monotonic() + 10
            while "ledger.write" not in names(exporter.get_finished_spans()):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        await tracing.aclose()
    spans = exporter.get_finished_spans()
    root = one(spans, "chat.completions").context.span_id
    assert len({s.context.trace_id for s in spans}) == 1
    for name in ("route", "queue.wait", "job", "ledger.write"):
        assert parent_of(one(spans, name)) == root, name
    assert parent_of(one(spans, "backend.attempt")) == one(spans, "job").context.span_id
