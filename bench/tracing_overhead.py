"""What OpenTelemetry tracing costs per request, off (the default) and on.

1. ``hooks``: the tracing hooks one non-streamed request passes through, called in a loop
   exactly as the edge and the worker call them (middleware span, ``routed``, ``traceparent``,
   ``answered``, ``adopt``, ``job``/``job_done``, one ``attempt``, ``ledger_write``). Off:
   ``Tracing.off()`` and no middleware — what the request path pays for the feature existing.
   On: the SDK with a ``BatchSpanProcessor`` whose exporter drops the spans (the request path's
   part: spans, attributes, the hand-over to the export queue); then ``export``: the export
   thread's protobuf encoding of those spans (CPU the process spends off the request path).
2. ``e2e``: whole requests through the public app (in-process, httpx ASGI transport), one edge
   and one worker service on the real Redis, an in-process simulator with no modelled latency;
   tracing off vs on with the real OTLP/HTTP exporter posting to a receiver in another process.
   Rounds alternate between the two stacks; per request: median latency and process CPU time
   (which includes the export thread).

    .venv/bin/python bench/tracing_overhead.py      # writes bench/results/tracing_overhead.json
    .venv/bin/python bench/tracing_overhead.py --requests 100 --rounds 2 --out /tmp/t.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends.sim import PROFILES, create_sim_app
from gateway.accounting.records import Attempt, LedgerEntry
from gateway.app import create_app
from gateway.observability.tracing import Tracing
from gateway.queue.jobs import Job
from gateway.reply_meta import ReplyMeta
from gateway.services import open_services
from gateway.settings import load_settings
from router.catalog import Tier
from router.plan import RoutePlan
from tests.support import free_port, gateway_config

RESULTS = Path(__file__).resolve().parent / "results" / "tracing_overhead.json"
MODEL = "llama-3.1-8b-instruct"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


# -- 1. the hooks -------------------------------------------------------------------------


def _fixtures() -> tuple[dict[str, Any], RoutePlan, Job, LedgerEntry, ReplyMeta]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", b"Bearer x"), (b"content-type", b"application/json")],
        "state": {"request_id": "req_0"},
    }
    plan = RoutePlan(
        tier=Tier.SMALL, deployments=(MODEL,), rule="auto:threshold", reason="r", score=0.2
    )
    now = time.time()
    job = Job(
        request_id="req_0",
        tenant="acme",
        principal="acme",
        reply_to="edge",
        plan=plan,
        body={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        stream=False,
        enqueued_at=now,
        deadline=now + 60,
        received_at=now,
        traceparent=TRACEPARENT,
    )
    entry = LedgerEntry(
        request_id="req_0",
        tenant="acme",
        principal="acme",
        created_at=datetime.now(UTC),
        outcome="ok",
        status_code=200,
        requested_model="auto",
        tier="small",
        deployment=MODEL,
        prompt_tokens=20,
        completion_tokens=30,
        attempts=(Attempt(MODEL, "ok", 3.0, 20, 30),),
    )
    meta = ReplyMeta(
        deployment=MODEL,
        tier="small",
        queue_ms=1.0,
        prompt_tokens=20,
        completion_tokens=30,
        cost_usd=Decimal("0.000002"),
    )
    return scope, plan, job, entry, meta


async def _one_request(
    tracing: Tracing,
    scope: dict[str, Any],
    plan: RoutePlan,
    job: Job,
    entry: LedgerEntry,
    meta: ReplyMeta,
) -> None:
    """The hooks of one request, as the edge and the worker call them."""
    if tracing.enabled:  # the middleware, installed only when on
        span = tracing.start_request(scope)
        token = otel_context.attach(trace.set_span_in_context(span))
    tracing.routed("acme", plan, 0.0002)
    tracing.traceparent()
    tracing.answered(meta, "ok", False)
    if tracing.enabled:
        Tracing.end_request(span, 200, "req_0")
        otel_context.detach(token)
    # worker side (a task of its own in the worker; here the context is restored after)
    saved = otel_context.get_current()
    tracing.adopt(job)
    with tracing.job(job) as job_span:
        if tracing.enabled:
            now = time.time()
            tracing.attempt(
                deployment=MODEL, provider="vllm", number=1, kind="first", reason=None,
                outcome="ok", started=now - 0.003, ended=now, server="127.0.0.1:8000",
                input_tokens=20, output_tokens=30,
            )  # fmt: skip
        tracing.job_done(job_span, entry)

    async def write(_: LedgerEntry) -> str:
        return "stream"

    await tracing.ledger_write(entry, write)
    otel_context.attach(saved)


async def bench_hooks(n: int) -> dict[str, Any]:
    """CPU time of this thread (the event loop's) per request, best of 5 runs of ``n``."""
    scope, plan, job, entry, meta = _fixtures()
    out: dict[str, Any] = {}
    recorder = InMemorySpanExporter()
    on = Tracing.with_exporter(_Drop(), batch=True, max_queue_size=1_000_000)
    unsampled = Tracing.with_exporter(_Drop(), batch=True, sample_ratio=0.0)
    modes = (
        ("off", Tracing.off(), dataclasses.replace(job, traceparent=None)),
        ("on", on, job),
        ("on_not_sampled", unsampled, dataclasses.replace(job, traceparent=UNSAMPLED)),
    )
    for name, tracing, its_job in modes:
        for _ in range(2_000):
            await _one_request(tracing, scope, plan, its_job, entry, meta)
        best = []
        for _ in range(5):
            started = time.thread_time()
            for _ in range(n):
                await _one_request(tracing, scope, plan, its_job, entry, meta)
            best.append((time.thread_time() - started) / n * 1e6)
        out[f"{name}_us_per_request"] = round(min(best), 3)
    await on.aclose()
    await unsampled.aclose()
    # the export thread's work: encoding one request's spans to OTLP protobuf
    traced = Tracing.with_exporter(recorder, batch=False)
    await _one_request(traced, scope, plan, job, entry, meta)
    spans = recorder.get_finished_spans()
    out["spans_per_request"] = len(spans)
    reps = max(n // 10, 100)
    started = time.thread_time()
    for _ in range(reps):
        encode_spans(spans).SerializeToString()
    out["export_encode_us_per_request"] = round((time.thread_time() - started) / reps * 1e6, 3)
    out["export_bytes_per_request"] = len(encode_spans(spans).SerializeToString())
    # baseline for scale: an empty coroutine call, the cheapest hook-shaped thing
    started = time.thread_time()
    for _ in range(n):
        await _noop()
    out["empty_await_us"] = round((time.thread_time() - started) / n * 1e6, 3)
    await traced.aclose()
    return out


async def _noop() -> None:
    return None


# -- 2. whole requests --------------------------------------------------------------------

_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@contextlib.asynccontextmanager
async def _stack(
    workdir: Path, redis_url: str, sim_port: int, tracing: Tracing
) -> AsyncIterator[httpx.AsyncClient]:
    prefix = f"tgbench-{uuid.uuid4().hex[:8]}"
    path = gateway_config(
        workdir=workdir,
        redis_url=redis_url,
        prefix=prefix,
        database_url=f"sqlite+aiosqlite:///{workdir / f'{prefix}.db'}",
        sim_ports={MODEL: sim_port},
        port=free_port(),
        admin_port=free_port(),
    )
    config = yaml.safe_load(path.read_text())
    config["fallback"]["breaker"]["health_interval_s"] = 0
    path.write_text(yaml.safe_dump(config))
    settings = load_settings(path)
    async with (
        open_services(settings, dev=True, workers=True, tracing=tracing) as worker,
        open_services(settings, dev=True, workers=False, tracing=tracing) as edge,
    ):
        del worker
        app = create_app(services=edge)
        app.state.services = edge
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client
    import redis

    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(match=f"{prefix}:*", count=1000):
        r.delete(key)
    r.close()


async def _round(client: httpx.AsyncClient, n: int) -> tuple[list[float], float]:
    body = {"model": "small", "messages": [{"role": "user", "content": "What is 2+2?"}]}
    headers = {"authorization": "Bearer dev-acme"}
    latencies = []
    cpu0 = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        reply = await client.post("/v1/chat/completions", json=body, headers=headers)
        latencies.append((time.perf_counter() - started) * 1e6)
        assert reply.status_code == 200, reply.text
    return latencies, (time.process_time() - cpu0) / n * 1e6


async def bench_e2e(redis_url: str, requests: int, rounds: int) -> dict[str, Any]:
    receiver_port = free_port()
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RECEIVER, str(receiver_port)
    )
    runner = web.AppRunner(create_sim_app(PROFILES[MODEL], time_scale=0.0))
    await runner.setup()
    sim_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", sim_port).start()
    on = Tracing.with_exporter(
        OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver_port}/v1/traces"), batch=True
    )
    results: dict[str, dict[str, list[float]]] = {
        m: {"p50": [], "mean": [], "cpu": []} for m in ("off", "on")
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                _stack(Path(tmp), redis_url, sim_port, Tracing.off()) as off_client,
                _stack(Path(tmp), redis_url, sim_port, on) as on_client,
            ):
                for client in (off_client, on_client):
                    await _round(client, 100)  # warm-up
                for _ in range(rounds):
                    for mode, client in (("off", off_client), ("on", on_client)):
                        latencies, cpu = await _round(client, requests)
                        results[mode]["p50"].append(statistics.median(latencies))
                        results[mode]["mean"].append(statistics.fmean(latencies))
                        results[mode]["cpu"].append(cpu)
    finally:
        await on.aclose()
        await runner.cleanup()
        receiver.terminate()
        await receiver.wait()
    out: dict[str, Any] = {"requests_per_round": requests, "rounds": rounds}
    for mode, figures in results.items():
        for what, values in figures.items():
            out[f"{mode}_{what}_us"] = round(statistics.median(values), 1)
    for what in ("p50", "mean", "cpu"):
        out[f"on_minus_off_{what}_us"] = round(out[f"on_{what}_us"] - out[f"off_{what}_us"], 1)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "opentelemetry-sdk": importlib.metadata.version("opentelemetry-sdk"),
        },
        "hooks": await bench_hooks(args.loops),
        "e2e": await bench_e2e(args.redis_url, args.requests, args.rounds),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--loops", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
