"""Hostile input gets a clear 4xx with an OpenAI error body, before Redis or a backend is used."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from gateway.api.http_limits import limited_httptools
from gateway.api.stream_idle import idle_limited
from gateway.errors import DeadlineExceeded
from gateway.settings import Settings
from tests.gateway.auth.conftest import auth_settings
from tests.support import free_port, uvicorn_in_thread

ACME = {"authorization": "Bearer dev-acme"}
LIMITS = {
    "max_body_bytes": 64 * 1024,
    "max_messages": 8,
    "max_content_parts": 4,
    "max_prompt_chars": 20_000,
    "max_prompt_tokens": 2_000,
    "max_output_tokens": 1_000,
}


@pytest.fixture
def settings(tmp_path: Path, redis_url: str, key_prefix: str) -> Settings:
    base = auth_settings(tmp_path, redis_url, key_prefix)
    return base.model_copy(update={"limits": base.limits.model_copy(update=LIMITS)})


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **fields}


def _user(content: Any) -> dict[str, Any]:
    return _chat(messages=[{"role": "user", "content": content}])


CASES: list[tuple[str, bytes, int, str]] = [
    ("body", orjson.dumps(_user("x" * 70_000)), 413, "request_too_large"),
    ("not json", b"{nope", 400, "invalid_json"),
    ("not an object", b"[1, 2]", 400, "invalid_json"),
    ("messages", orjson.dumps(_chat(messages=[{"role": "user", "content": "a"}] * 9)), 400, ""),
    ("parts", orjson.dumps(_user([{"type": "text", "text": "a"}] * 5)), 400, ""),
    ("characters", orjson.dumps(_user([{"type": "text", "text": "é" * 10_001}] * 2)), 400, ""),
    ("tokens", orjson.dumps(_user("word " * 3_000)), 400, "context_length_exceeded"),
    ("max_tokens", orjson.dumps(_chat(max_tokens=1_001)), 400, ""),
    ("max_completion_tokens", orjson.dumps(_chat(max_completion_tokens=10**9)), 400, ""),
    ("wrong types", orjson.dumps(_chat(messages="hi")), 400, "invalid_request"),
    ("no messages", orjson.dumps(_chat(messages=[])), 400, "invalid_request"),
    ("n", orjson.dumps(_chat(n=9)), 400, "invalid_request"),
    # found by the fuzzer: litellm turned this into a "connection error" (502, breaker opened)
    ("no content", orjson.dumps(_chat(messages=[{"role": "developer"}])), 400, ""),
    (
        "assistant without content or tools",
        orjson.dumps(
            _user("hi") | {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}
        ),
        400,
        "",
    ),
]


@pytest.mark.parametrize(("what", "body", "status", "code"), CASES, ids=[c[0] for c in CASES])
async def test_admission_limits(
    public_client: httpx.AsyncClient, what: str, body: bytes, status: int, code: str
) -> None:
    response = await public_client.post(
        "/v1/chat/completions",
        content=body,
        headers={**ACME, "content-type": "application/json"},
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == (code or "invalid_request")
    assert "x" * 100 not in error["message"]  # the prompt is not echoed back


# The header limit lives in the HTTP protocol: a real uvicorn server on a small app.


async def _echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture(scope="module")
def limited_server() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        _echo_app,
        host="127.0.0.1",
        port=port,
        http=limited_httptools(4096),
        lifespan="off",
        log_level="error",
    )
    with uvicorn_in_thread(config):
        yield port


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        # refused mid-send: the answer is already waiting
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize("size", [5_000, 100_000, 4_000_000])
def test_oversized_headers_get_431(limited_server: int, size: int) -> None:
    started = time.monotonic()
    answer = _raw(
        limited_server, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    body = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_headers_too_large"
    assert time.monotonic() - started < 5


def test_many_small_headers_count_too(limited_server: int) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(800))
    answer = _raw(limited_server, b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_a_long_url_counts(limited_server: int) -> None:
    answer = _raw(limited_server, b"GET /" + b"a" * 6000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_small_head_with_large_body_is_served(limited_server: int) -> None:
    body = b"b" * 1_000_000
    request = (
        b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    answer = _raw(limited_server, request + body)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
    assert b"\r\n1000000\r\n" in answer  # the whole body reached the app


async def test_a_silent_stream_ends_with_an_error() -> None:
    async def replies() -> AsyncIterator[int]:
        yield 1
        yield 2
        await asyncio.sleep(30)
        yield 3

    got: list[int] = []
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        async for item in idle_limited(replies(), 0.2):
            got.append(item)
    assert got == [1, 2] and info.value.code == "stream_idle"
    assert time.monotonic() - started < 5


async def test_a_lively_stream_is_not_cut() -> None:
    async def replies() -> AsyncIterator[int]:
        for i in range(10):
            await asyncio.sleep(0.05)
            yield i

    assert [i async for i in idle_limited(replies(), 0.5)] == list(range(10))
