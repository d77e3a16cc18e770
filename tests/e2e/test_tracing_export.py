"""Traces leave a real ``tiergate serve`` process over OTLP/HTTP: a receiver in the test takes
``POST /v1/traces`` like a collector, and the protobuf it gets holds the request's whole span
tree (edge, queue, worker, backend, ledger) in the caller's trace — and no prompt, answer or
key, checked on the bytes that crossed the wire. The spans are sent when the gateway stops
(the batch's 5 s delay has not passed): shutdown flushes them."""

from __future__ import annotations

import gzip
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support import (
    TEST_KEYS,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)

SMALL = "llama-3.1-8b-instruct"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TOKEN = f"otlp-token-{uuid.uuid4().hex}"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Collector:
    port: int
    posts: list[Received] = field(default_factory=list)


@pytest.fixture
def collector() -> Iterator[Collector]:
    got = Collector(port=0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            got.posts.append(
                Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield got
    server.shutdown()
    server.server_close()


def test_spans_are_exported_over_otlp_http(
    tmp_path: Path,
    redis_url: str,
    key_prefix: str,
    collector: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim_port = free_port()
    sim, _usage = start_sim(SMALL, sim_port, tmp_path)
    monkeypatch.setenv("TIERGATE_TEST_OTLP_TOKEN", TOKEN)  # the gateway process inherits it
    port = free_port()
    config = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        sim_ports={SMALL: sim_port},
        port=port,
        admin_port=free_port(),
        tracing={
            "enabled": True,
            "endpoint": f"http://127.0.0.1:{collector.port}",
            "service_name": "tiergate-e2e",
            "headers_env": {"authorization": "TIERGATE_TEST_OTLP_TOKEN"},
        },
    )
    gateway = start_gateway(config, tmp_path)
    prompt = f"exported-secret-{uuid.uuid4().hex}"
    key = TEST_KEYS["TIERGATE_KEY_INITECH"]
    try:
        wait_ready(gateway, f"http://127.0.0.1:{port}/readyz")
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "small", "messages": [{"role": "user", "content": prompt}]},
            headers={
                "authorization": f"Bearer {key}",
                "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
            },
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()["choices"][0]["message"]["content"]
    finally:
        assert gateway.stop() == 0, gateway.output()
        sim.stop()

    assert collector.posts, f"nothing exported:\n{gateway.output()}"
    for post in collector.posts:
        assert post.path == "/v1/traces"
        assert post.headers["content-type"] == "application/x-protobuf"
        assert post.headers["authorization"] == TOKEN
        assert post.body
        for secret in (prompt, answer, key):
            assert secret.encode() not in post.body

    spans = []
    for post in collector.posts:
        request = ExportTraceServiceRequest()
        request.ParseFromString(post.body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert resource["service.name"] == "tiergate-e2e"
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "tiergate"
                spans.extend(scope_spans.spans)
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {
        "chat.completions",
        "route",
        "queue.wait",
        "job",
        "backend.attempt",
        "ledger.write",
    }
    assert {s.trace_id.hex() for s in spans} == {CLIENT_TRACE}
    edge = by_name["chat.completions"]
    assert edge.parent_span_id.hex() == CLIENT_SPAN
    assert by_name["job"].parent_span_id == edge.span_id
    assert by_name["backend.attempt"].parent_span_id == by_name["job"].span_id
    attrs = {a.key: a.value for a in edge.attributes}
    assert attrs["tiergate.request_id"].string_value == reply.headers["x-request-id"]
    assert attrs["http.response.status_code"].int_value == 200
    attempt = {a.key: a.value for a in by_name["backend.attempt"].attributes}
    assert attempt["server.port"].int_value == sim_port
    assert attempt["gen_ai.usage.output_tokens"].int_value > 0
