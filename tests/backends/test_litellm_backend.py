"""LiteLLMBackend against a scripted OpenAI-compatible server on 127.0.0.1 (``openai/<model>``
with ``api_base``; real HTTP through litellm, no mocks), and litellm's exceptions translated.

litellm is imported once for the module (it takes seconds). The pinned 1.82.6 emits no warning
at import, but its stream wrapper reads ``model_fields`` and ``model_computed_fields`` on
instances, which pydantic 2.11+ deprecates; with warnings as errors that warning is raised
inside litellm and becomes a stream error, so exactly those two warnings are ignored here.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from backends.errors import (
    BackendConnectError,
    BackendError,
    BackendNotConfigured,
    BackendProtocolError,
    BackendRateLimited,
    BackendRejected,
    BackendStreamCut,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
)
from backends.factory import make_backend
from backends.http_errors import error_from_litellm
from backends.litellm_backend import LiteLLMBackend, load_litellm
from backends.protocol import Backend
from backends.types import ChatChunk, ChatRequest, Usage

pytestmark = pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211"
)

litellm = load_litellm()

USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-test",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}
    ],
    "usage": USAGE,
}


def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    data = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": choices,
    }
    if usage:
        data["usage"] = usage
    return b"data: " + orjson.dumps(data) + b"\n\n"


STREAM = [
    chunk({"role": "assistant", "content": "Hi"}),
    chunk({"content": "!"}),
    chunk({}, "stop"),
    chunk(None, usage=USAGE),
    b"data: [DONE]\n\n",
]
STREAM_LAST_TOKEN_FINISHES = [  # vLLM's shape, and the simulator's: no empty finishing delta
    chunk({"role": "assistant", "content": "Hi"}),
    chunk({"content": "!"}, "stop"),
    chunk(None, usage=USAGE),
    b"data: [DONE]\n\n",
]
VLLM_CTX_OLD = {
    "object": "error",
    "message": "This model's maximum context length is 8192 tokens. However, you requested "
    "9000 tokens. Please reduce the length of the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
VLLM_CTX_NEW = {
    "error": {
        "message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's "
        "maximum context length is 4096 tokens and your request has 2778 input tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


@dataclass
class Seen:
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[CIMultiDict[str]] = field(default_factory=list)


async def sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event)
    return resp


async def ok(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if body.get("stream"):
        return await sse(request, STREAM)
    return web.Response(body=orjson.dumps(ANSWER), content_type="application/json")


async def ok_last(request: web.Request) -> web.StreamResponse:
    return await sse(request, STREAM_LAST_TOKEN_FINISHES)


async def cut(request: web.Request) -> web.StreamResponse:
    return await sse(request, STREAM[:2])


async def garbage_stream(request: web.Request) -> web.StreamResponse:
    return await sse(request, [b"data: {not json\n\n"])


async def hang(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(30)  # cancelled when the client goes away
    raise AssertionError("unreachable")


def fixed(
    status: int, body: Any, **headers: str
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return web.Response(
            status=status, body=raw, headers=headers, content_type="application/json"
        )

    return handler


SCENARIOS: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
    "ok": ok,
    "ok_last": ok_last,
    "cut": cut,
    "hang": hang,
    "429": fixed(
        429,
        {"error": {"message": "Rate limit reached", "type": "requests"}},
        **{"Retry-After": "7"},
    ),
    "500": fixed(500, {"error": {"message": "boom", "type": "server_error"}}),
    "503": fixed(503, {"object": "error", "message": "queue full", "code": 503}),
    "ctx_old": fixed(400, VLLM_CTX_OLD),
    "ctx_new": fixed(400, VLLM_CTX_NEW),
    "400": fixed(
        400, {"error": {"message": "temperature out of range", "type": "invalid_request_error"}}
    ),
    "401": fixed(401, {"error": {"message": "Incorrect API key", "type": "invalid_request_error"}}),
    "500_html": fixed(500, b"<html>Internal Server Error</html>"),
    # 200s whose body is not a chat completion: the provider answered (and bills it)
    "200_half": fixed(200, orjson.dumps(ANSWER)[:40]),
    "200_html": fixed(200, b"<html>upstream says hello</html>"),
    "200_shape": fixed(200, {"id": "c1", "object": "chat.completion", "usage": USAGE}),
    "200_null": fixed(200, b"null"),
    "200_garbage_stream": garbage_stream,
}


@dataclass
class Server:
    url: str
    seen: Seen


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    seen = Seen()

    async def dispatch(request: web.Request) -> web.StreamResponse:
        seen.bodies.append(orjson.loads(await request.read()))
        seen.headers.append(request.headers.copy())
        return await SCENARIOS[request.match_info["scenario"]](request)

    app = web.Application()
    app.router.add_post("/{scenario}/v1/chat/completions", dispatch)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", seen)
    finally:
        await runner.cleanup()


@pytest.fixture
async def make(server: Server) -> AsyncIterator[Callable[..., LiteLLMBackend]]:
    made: list[LiteLLMBackend] = []

    def factory(scenario: str, **kwargs: Any) -> LiteLLMBackend:
        backend = LiteLLMBackend(
            "ext",
            "openai/gpt-test",
            api_base=f"{server.url}/{scenario}/v1",
            api_key="sk-test",
            **kwargs,
        )
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        await backend.aclose()


def req(headers: dict[str, str] | None = None, **body: Any) -> ChatRequest:
    base = {"model": "external", "messages": [{"role": "user", "content": "hi"}]}
    return ChatRequest(
        model="gpt-test", body=base | body, request_id="req-9", headers=headers or {}
    )


async def collect(backend: LiteLLMBackend, request: ChatRequest | None = None) -> list[ChatChunk]:
    return [c async for c in backend.stream(request or req())]


def test_module_import_does_not_import_litellm() -> None:
    import subprocess

    code = (
        "import sys, backends, backends.litellm_backend, backends.factory;"
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_litellm_is_configured_as_a_library() -> None:
    import os

    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert litellm.telemetry is False
    assert litellm.success_callback == [] and litellm.failure_callback == []


async def test_factory_builds_it_by_provider_name() -> None:
    backend = make_backend("litellm", name="ext", litellm_model="openai/gpt-test", api_key="k")
    assert isinstance(backend, LiteLLMBackend)
    await backend.aclose()


async def test_chat(make: Callable[..., LiteLLMBackend], server: Server) -> None:
    backend = make("ok")
    assert isinstance(backend, Backend)
    request = req(
        headers={"Authorization": "Bearer tiergate-key", "traceparent": "00-1-01"},
        temperature=0.1,
        top_k=5,
        api_base="http://evil.invalid",
    )
    response = await backend.chat(request)
    assert response.usage == Usage(9, 2)
    assert response.body["choices"][0]["message"]["content"] == "Hi!"
    assert isinstance(orjson.dumps(response.body), bytes)  # plain, JSON-ready data
    assert b"provider_specific_fields" not in orjson.dumps(response.body)  # litellm's own
    sent = server.seen.bodies[0]
    assert sent["model"] == "gpt-test" and sent["temperature"] == 0.1
    assert sent["top_k"] == 5  # unknown fields go through as extra_body
    assert sent["api_base"] == "http://evil.invalid"  # ...as data, never as litellm's argument
    assert server.seen.headers[0]["x-request-id"] == "req-9"
    assert server.seen.headers[0]["Authorization"] == "Bearer sk-test"  # never the caller's
    assert server.seen.headers[0]["traceparent"] == "00-1-01"


@pytest.mark.parametrize("scenario", ["ok", "ok_last"])
async def test_stream_with_usage(
    make: Callable[..., LiteLLMBackend], server: Server, scenario: str
) -> None:
    chunks = await collect(make(scenario))
    text = "".join(
        c.data["choices"][0]["delta"].get("content") or "" for c in chunks if c.data["choices"]
    )
    assert text == "Hi!"
    # OpenAI's shape, whatever order litellm re-emits them in: the finish_reason, then the usage
    # alone in a last chunk with no choices; no chunk before carries a usage.
    assert chunks[-1].usage == Usage(9, 2) and chunks[-1].data["choices"] == []
    assert chunks[-2].data["choices"][0]["finish_reason"] == "stop"
    assert all(c.usage is None and not c.data.get("usage") for c in chunks[:-1])
    assert not any(b"provider_specific_fields" in orjson.dumps(c.data) for c in chunks)
    sent = server.seen.bodies[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("scenario", "cls", "retry_after"),
    [
        ("429", BackendRateLimited, 7.0),
        ("500", BackendUnavailable, None),
        ("503", BackendUnavailable, None),
        ("ctx_old", ContextLengthExceeded, None),
        ("ctx_new", ContextLengthExceeded, None),
        ("400", BackendRejected, None),
        ("401", BackendNotConfigured, None),
        ("500_html", BackendUnavailable, None),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
async def test_errors(
    make: Callable[..., LiteLLMBackend],
    scenario: str,
    cls: type[BackendError],
    retry_after: float | None,
    streamed: bool,
) -> None:
    backend = make(scenario)
    with pytest.raises(BackendError) as info:
        await (collect(backend) if streamed else backend.chat(req()))
    assert type(info.value) is cls, info.value
    assert info.value.backend == "ext"
    assert info.value.retry_after == retry_after
    assert not isinstance(info.value.__cause__, BackendError)  # translated from litellm's


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("200_half", "not JSON (Unterminated string"),
        ("200_html", "not JSON (Expecting value at character 0)"),
        ("200_shape", "not a chat completion (Invalid response object)"),
        ("200_null", "not a chat completion (Empty or invalid response from LLM endpoint)"),
    ],
)
async def test_an_answer_that_cannot_be_read_is_a_protocol_error_of_a_200(
    make: Callable[..., LiteLLMBackend], scenario: str, reason: str
) -> None:
    """litellm reports it as a 500 of its own; the provider sent a 200, and billed the call
    (docs/costs.md): a protocol error with that status, and a short reason (litellm's message
    carries a traceback and the body, which may quote the answer)."""
    with pytest.raises(BackendProtocolError) as info:
        await make(scenario).chat(req())
    error = info.value
    assert (error.status, error.backend) == (200, "ext")
    assert error.message.startswith(f"the answer could not be read: {reason}"), error.message
    assert "Traceback" not in error.message and "site-packages" not in error.message
    assert len(error.message) < 200


async def test_a_stream_whose_first_event_cannot_be_read_is_a_protocol_error_of_a_200(
    make: Callable[..., LiteLLMBackend],
) -> None:
    """Not a request litellm refused (its ``APIConnectionError``): the provider answered."""
    with pytest.raises(BackendProtocolError) as info:
        await collect(make("200_garbage_stream"))
    assert info.value.status == 200
    assert info.value.message.startswith("the answer could not be read: not JSON")


async def test_stream_cut(make: Callable[..., LiteLLMBackend]) -> None:
    with pytest.raises(BackendStreamCut):
        await collect(make("cut"))


async def test_first_token_timeout(make: Callable[..., LiteLLMBackend]) -> None:
    with pytest.raises(BackendTimeout, match="first token"):
        await collect(make("hang", first_token_s=0.2))


async def test_total_timeout(make: Callable[..., LiteLLMBackend]) -> None:
    with pytest.raises(BackendTimeout, match="total"):
        await make("hang", total_s=0.2).chat(req())


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = LiteLLMBackend(
        "ext", "openai/gpt-test", api_base=f"http://127.0.0.1:{port}/v1", api_key="k"
    )
    try:
        with pytest.raises(BackendConnectError):
            await backend.chat(req())
    finally:
        await backend.aclose()


# --- the translation table, with litellm's own exception objects -----------------------------


def _response(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=httpx.Request("POST", "http://x/v1"))


def _caused(exc: Exception, cause: BaseException) -> Exception:
    exc.__cause__ = cause
    return exc


def _kw() -> dict[str, Any]:
    return {"model": "m", "llm_provider": "openai"}


@pytest.mark.parametrize(
    ("make_exc", "started", "cls"),
    [
        (lambda: litellm.Timeout("slow", **_kw()), False, BackendTimeout),
        (
            lambda: _caused(
                litellm.APIConnectionError("refused", **_kw()), ConnectionRefusedError()
            ),
            False,
            BackendConnectError,
        ),
        # litellm's own failure on a request it cannot build ("OpenAIException - 'content'"):
        # nothing underneath is a transport error, so the request is what failed
        (lambda: litellm.APIConnectionError("'content'", **_kw()), False, BackendRejected),
        (lambda: litellm.APIConnectionError("reset", **_kw()), True, BackendStreamCut),
        (
            lambda: litellm.RateLimitError(
                "slow down", response=_response(429, **{"retry-after": "3"}), **_kw()
            ),
            False,
            BackendRateLimited,
        ),
        (lambda: litellm.ServiceUnavailableError("down", **_kw()), False, BackendUnavailable),
        (lambda: litellm.InternalServerError("oops", **_kw()), False, BackendUnavailable),
        (
            lambda: litellm.ContextWindowExceededError("too long", **_kw()),
            False,
            ContextLengthExceeded,
        ),
        (
            lambda: litellm.BadRequestError("maximum context length is 10 tokens", **_kw()),
            False,
            ContextLengthExceeded,
        ),
        (lambda: litellm.BadRequestError("bad temperature", **_kw()), False, BackendRejected),
        (lambda: litellm.AuthenticationError("bad key", **_kw()), False, BackendNotConfigured),
        (lambda: litellm.NotFoundError("no such model", **_kw()), False, BackendRejected),
        (
            lambda: litellm.exceptions.MidStreamFallbackError(
                "cut", original_exception=litellm.APIConnectionError("reset", **_kw()), **_kw()
            ),
            True,
            BackendStreamCut,
        ),
        (lambda: httpx.ReadTimeout("read"), True, BackendTimeout),
        (lambda: httpx.RemoteProtocolError("peer closed"), True, BackendStreamCut),
        (lambda: TimeoutError(), False, BackendTimeout),
        (lambda: ValueError("litellm bug"), False, BackendError),
    ],
)
def test_error_from_litellm(
    make_exc: Callable[[], Exception], started: bool, cls: type[BackendError]
) -> None:
    err = error_from_litellm(make_exc(), backend="ext", stream_started=started)
    assert type(err) is cls, err
    assert err.backend == "ext"


def test_retry_after_from_litellm_rate_limit() -> None:
    exc = litellm.RateLimitError("slow", response=_response(429, **{"Retry-After": "3"}), **_kw())
    assert error_from_litellm(exc, backend="e", stream_started=False).retry_after == 3.0
