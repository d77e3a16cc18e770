"""VLLMBackend against a scripted OpenAI-compatible server on 127.0.0.1 (real HTTP, no mocks).

Each scenario is a path prefix: the backend's ``base_url`` is ``{server}/{scenario}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from backends.errors import (
    BackendConnectError,
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
from backends.openai_http import VLLMBackend, chat_completions_url
from backends.protocol import Backend
from backends.sse import SSEDecoder
from backends.types import ChatChunk, ChatRequest, Usage

MODEL = "llama-3.1-8b-instruct"
USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
VLLM_CTX_OLD = {
    "object": "error",
    "message": "This model's maximum context length is 8192 tokens. However, you requested "
    "9000 tokens (8000 in the messages, 1000 in the completion). Please reduce the length "
    "of the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
VLLM_CTX_NEW = {
    "error": {
        "message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's "
        "maximum context length is 4096 tokens and your request has 2778 input tokens "
        "(8000 > 4096 - 2778).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
OPENAI_CTX = {
    "error": {
        "message": "Your input exceeds the context window of this model.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def chunk(content: str | None, finish: str | None = None, usage: Any = None) -> bytes:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    if choices and finish:
        choices[0]["finish_reason"] = finish
    data = {"id": "c1", "object": "chat.completion.chunk", "choices": choices, "usage": usage}
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"
FULL_STREAM = [chunk("Hel"), chunk("lo"), chunk("", "stop"), chunk(None, usage=USAGE), DONE]


@dataclass
class Seen:
    """What the server received, for assertions."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[CIMultiDict[str]] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)


Handler = Callable[[web.Request, Seen], Awaitable[web.StreamResponse]]


async def sse(request: web.Request, events: list[bytes], *, pause: float = 0) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event)
        if pause:
            await asyncio.sleep(pause)
    return resp


def error(status: int, body: Any, **headers: str) -> web.Response:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return web.Response(status=status, body=data, headers=headers, content_type="application/json")


async def ok(request: web.Request, seen: Seen) -> web.StreamResponse:
    if seen.bodies[-1].get("stream"):
        return await sse(request, FULL_STREAM)
    answer = {"id": "c1", "object": "chat.completion", "choices": [], "usage": USAGE}
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def crlf_bytewise(request: web.Request, seen: Seen) -> web.StreamResponse:
    raw = b"".join(FULL_STREAM).replace(b"\n", b"\r\n")
    return await sse(request, [raw[i : i + 1] for i in range(len(raw))])


async def hang(request: web.Request, seen: Seen) -> web.StreamResponse:
    await asyncio.sleep(30)  # cancelled when the client goes away
    raise AssertionError("unreachable")


async def stall(request: web.Request, seen: Seen) -> web.StreamResponse:
    await sse(request, [chunk("Hel")])
    return await hang(request, seen)


async def trickle(request: web.Request, seen: Seen) -> web.StreamResponse:
    try:
        return await sse(request, [chunk("x")] * 1000, pause=0.02)
    finally:
        seen.disconnected.set()


async def cut_clean(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await sse(request, FULL_STREAM[:2])  # ends the body without finish or [DONE]


async def cut_abort(request: web.Request, seen: Seen) -> web.StreamResponse:
    resp = await sse(request, FULL_STREAM[:2])
    assert request.transport is not None
    request.transport.abort()  # RST mid-body, chunked encoding unterminated
    return resp


async def finish_then_abort(request: web.Request, seen: Seen) -> web.StreamResponse:
    resp = await sse(request, FULL_STREAM[:3])
    assert request.transport is not None
    request.transport.abort()
    return resp


async def reset_before_response(request: web.Request, seen: Seen) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()
    return web.Response()


async def done_then_pause(request: web.Request, seen: Seen) -> web.StreamResponse:
    resp = await sse(request, FULL_STREAM)
    await asyncio.sleep(0.02)  # the end of the chunked body comes a little after [DONE]
    return resp


async def done_then_hang(request: web.Request, seen: Seen) -> web.StreamResponse:
    await sse(request, FULL_STREAM)
    return await hang(request, seen)


async def done_without_finish(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await sse(request, [chunk("a"), DONE])


async def finish_without_done(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await sse(request, FULL_STREAM[:4])


def running(completion: int) -> dict[str, int]:
    """vLLM's continuous usage after ``completion`` tokens of a 12-token prompt."""
    return {"prompt_tokens": 12, "completion_tokens": completion, "total_tokens": 12 + completion}


async def continuous_cut(request: web.Request, seen: Seen) -> web.StreamResponse:
    """vLLM with ``continuous_usage_stats``: usage in every chunk; cut after two tokens."""
    resp = await sse(request, [chunk("Hel", usage=running(1)), chunk("lo", usage=running(2))])
    assert request.transport is not None
    request.transport.abort()
    return resp


def error_event(body: dict[str, Any]) -> Handler:
    async def handler(request: web.Request, seen: Seen) -> web.StreamResponse:
        return await sse(request, [chunk("a"), b"data: " + orjson.dumps(body) + b"\n\n", DONE])

    return handler


def fixed(response: Callable[[], web.StreamResponse]) -> Handler:
    async def handler(request: web.Request, seen: Seen) -> web.StreamResponse:
        return response()

    return handler


SCENARIOS: dict[str, Handler] = {
    "ok": ok,
    "crlf": crlf_bytewise,
    "hang": hang,
    "stall": stall,
    "trickle": trickle,
    "cut_clean": cut_clean,
    "cut_abort": cut_abort,
    "finish_then_abort": finish_then_abort,
    "reset": reset_before_response,
    "done_without_finish": done_without_finish,
    "done_then_pause": done_then_pause,
    "done_then_hang": done_then_hang,
    "finish_without_done": finish_without_done,
    "continuous_cut": continuous_cut,
    "event_error_new": error_event({"error": {"message": "engine died", "code": 500}}),
    "event_error_old": error_event({"object": "error", "message": "bad logits", "code": 400}),
    "bad_json": fixed(lambda: web.Response(body=b"{not json", content_type="application/json")),
    "json_for_stream": fixed(lambda: web.json_response({"id": "c1"})),
    "429": fixed(lambda: error(429, {"error": {"message": "slow down"}}, **{"Retry-After": "7"})),
    "503": fixed(
        lambda: error(503, {"object": "error", "message": "queue full"}, **{"Retry-After": "2"})
    ),
    "500": fixed(lambda: web.Response(status=500, text="Internal Server Error")),
    "ctx_old": fixed(lambda: error(400, VLLM_CTX_OLD)),
    "ctx_new": fixed(lambda: error(400, VLLM_CTX_NEW)),
    "ctx_openai": fixed(lambda: error(400, OPENAI_CTX)),
    "400": fixed(
        lambda: error(400, {"error": {"message": "temperature must be >= 0", "code": 400}})
    ),
    "401": fixed(lambda: error(401, {"error": {"message": "invalid api key"}})),
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
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen.peers.append(peer[1] if peer else 0)
        return await SCENARIOS[request.match_info["scenario"]](request, seen)

    app = web.Application()
    app.router.add_post("/{scenario}/v1/chat/completions", dispatch)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", seen)
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def make(server: Server, session: aiohttp.ClientSession) -> Callable[..., VLLMBackend]:
    def factory(scenario: str, **kwargs: Any) -> VLLMBackend:
        return VLLMBackend("r1", f"{server.url}/{scenario}", session, **kwargs)

    return factory


def req(**kwargs: Any) -> ChatRequest:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body |= kwargs.pop("body", {})
    return ChatRequest(model=MODEL, body=body, request_id="req-1", **kwargs)


async def collect(backend: VLLMBackend, request: ChatRequest | None = None) -> list[ChatChunk]:
    return [c async for c in backend.stream(request or req())]


# --- wire format ----------------------------------------------------------------------------


async def test_chat_sends_the_request_and_parses_the_answer(
    make: Callable[..., VLLMBackend], server: Server
) -> None:
    backend = make("ok", api_key="sk-test")
    request = req(
        body={"stream_options": {"include_usage": True}, "temperature": 0.2},
        headers={"traceparent": "00-abc-01", "Authorization": "Bearer client-key"},
    )
    response = await backend.chat(request)
    assert response.usage == Usage(12, 3)
    assert response.body["object"] == "chat.completion"
    sent, headers = server.seen.bodies[0], server.seen.headers[0]
    assert sent["model"] == MODEL and sent["stream"] is False and sent["temperature"] == 0.2
    assert "stream_options" not in sent  # vLLM rejects stream_options without stream
    assert headers["x-request-id"] == "req-1"
    assert headers["traceparent"] == "00-abc-01"
    assert headers["Authorization"] == "Bearer sk-test"  # ours, never the caller's


async def test_a_callers_credentials_never_reach_the_backend(
    make: Callable[..., VLLMBackend], server: Server
) -> None:
    await make("ok").chat(req(headers={"authorization": "Bearer tiergate-key", "X-Api-Key": "k"}))
    assert "Authorization" not in server.seen.headers[0]
    assert "X-Api-Key" not in server.seen.headers[0]


async def test_stream_yields_chunks_and_usage(
    make: Callable[..., VLLMBackend], server: Server
) -> None:
    chunks = await collect(
        make("ok"), req(body={"stream_options": {"continuous_usage_stats": False}})
    )
    text = "".join(c.data["choices"][0]["delta"]["content"] for c in chunks if c.data["choices"])
    assert text == "Hello"
    assert [c.usage for c in chunks] == [None, None, None, Usage(12, 3)]
    sent = server.seen.bodies[0]
    assert sent["stream"] is True and sent["model"] == MODEL
    # usage at the end, and in every chunk (so a cut stream still says what it cost)
    assert sent["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


@pytest.mark.parametrize("asked", [False, True], ids=["billing-only", "caller-asked"])
async def test_continuous_usage_is_read_from_every_chunk(
    make: Callable[..., VLLMBackend], asked: bool
) -> None:
    """A stream cut after two tokens has told its usage so far: the prompt and two tokens.
    It stays in the chunks' data only when the caller asked for continuous usage."""
    request = req(body={"stream_options": {"continuous_usage_stats": True}} if asked else {})
    got: list[ChatChunk] = []
    with pytest.raises(BackendStreamCut):
        async for piece in make("continuous_cut").stream(request):
            got.append(piece)
    assert [c.usage for c in got] == [Usage(12, 1), Usage(12, 2)]
    assert [("usage" in c.data) for c in got] == [asked, asked]


async def test_stream_parses_crlf_events_split_at_every_byte(
    make: Callable[..., VLLMBackend],
) -> None:
    chunks = await collect(make("crlf"))
    assert len(chunks) == 4 and chunks[-1].usage == Usage(12, 3)


@pytest.mark.parametrize(
    "scenario", ["done_without_finish", "finish_without_done", "finish_then_abort"]
)
async def test_stream_complete_endings(make: Callable[..., VLLMBackend], scenario: str) -> None:
    assert await collect(make(scenario))


@pytest.mark.parametrize("scenario", ["ok", "done_then_pause"])
async def test_stream_reuses_the_connection(
    make: Callable[..., VLLMBackend], server: Server, scenario: str
) -> None:
    backend = make(scenario)
    for _ in range(3):
        await collect(backend)
    assert len(set(server.seen.peers)) == 1


async def test_a_body_left_open_after_done_does_not_hold_the_stream(
    make: Callable[..., VLLMBackend],
) -> None:
    chunks = await asyncio.wait_for(collect(make("done_then_hang")), 2)
    assert chunks[-1].usage == Usage(12, 3)


def test_base_url_with_or_without_v1() -> None:
    want = "http://h:1/v1/chat/completions"
    for base in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert str(chat_completions_url(base)) == want


async def test_satisfies_the_protocol_and_owns_only_its_own_session(
    session: aiohttp.ClientSession,
) -> None:
    injected = VLLMBackend("r1", "http://127.0.0.1:9", session)
    assert isinstance(injected, Backend)
    await injected.aclose()
    assert not session.closed
    owned = VLLMBackend.create("r2", "http://127.0.0.1:9")
    await owned.aclose()
    assert owned.name == "r2"


async def test_factory_builds_it_by_provider_name(session: aiohttp.ClientSession) -> None:
    backend = make_backend("vllm", name="small-0", base_url="http://127.0.0.1:9", session=session)
    assert isinstance(backend, VLLMBackend) and backend.name == "small-0"
    with pytest.raises(BackendNotConfigured, match="unknown provider 'bedrock'"):
        make_backend("bedrock", name="x")


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "cls", "status", "retry_after", "text"),
    [
        ("429", BackendRateLimited, 429, 7.0, "slow down"),
        ("503", BackendUnavailable, 503, 2.0, "queue full"),
        ("500", BackendUnavailable, 500, None, "Internal Server Error"),
        ("ctx_old", ContextLengthExceeded, 400, None, "maximum context length is 8192"),
        ("ctx_new", ContextLengthExceeded, 400, None, "maximum context length is 4096"),
        ("ctx_openai", ContextLengthExceeded, 400, None, "context window"),
        ("400", BackendRejected, 400, None, "temperature must be >= 0"),
        ("401", BackendNotConfigured, 401, None, "invalid api key"),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
async def test_error_responses(
    make: Callable[..., VLLMBackend],
    scenario: str,
    cls: type[Exception],
    status: int,
    retry_after: float | None,
    text: str,
    streamed: bool,
) -> None:
    backend = make(scenario)
    with pytest.raises(cls) as info:
        await (collect(backend) if streamed else backend.chat(req()))
    err = info.value
    assert type(err) is cls
    assert getattr(err, "status", None) == status
    assert getattr(err, "retry_after", None) == retry_after
    assert text in str(err) and "[r1]" in str(err)
    assert getattr(err, "retryable", None) is (status in (429, 500, 503))


async def test_bad_json_is_a_protocol_error(make: Callable[..., VLLMBackend]) -> None:
    with pytest.raises(BackendProtocolError):
        await make("bad_json").chat(req())


async def test_json_answer_to_a_stream_is_a_protocol_error(
    make: Callable[..., VLLMBackend],
) -> None:
    with pytest.raises(BackendProtocolError, match="asked for a stream"):
        await collect(make("json_for_stream"))


@pytest.mark.parametrize(
    ("scenario", "cls"),
    [("event_error_new", BackendUnavailable), ("event_error_old", BackendRejected)],
)
async def test_error_event_inside_a_stream(
    make: Callable[..., VLLMBackend], scenario: str, cls: type[Exception]
) -> None:
    got: list[ChatChunk] = []
    with pytest.raises(cls):
        async for c in make(scenario).stream(req()):
            got.append(c)
    assert len(got) == 1


@pytest.mark.parametrize("scenario", ["cut_clean", "cut_abort"])
async def test_stream_cut(make: Callable[..., VLLMBackend], scenario: str) -> None:
    got: list[ChatChunk] = []
    with pytest.raises(BackendStreamCut):
        async for c in make(scenario).stream(req()):
            got.append(c)
    assert len(got) == 2


@pytest.mark.parametrize("streamed", [False, True])
async def test_reset_before_the_response(make: Callable[..., VLLMBackend], streamed: bool) -> None:
    backend = make("reset")
    with pytest.raises(BackendConnectError):
        await (collect(backend) if streamed else backend.chat(req()))


async def test_connection_refused(session: aiohttp.ClientSession) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = VLLMBackend("r1", f"http://127.0.0.1:{port}", session)
    with pytest.raises(BackendConnectError, match="cannot connect"):
        await backend.chat(req())
    with pytest.raises(BackendConnectError):
        await collect(backend)


async def test_garbage_response_is_a_protocol_error(session: aiohttp.ClientSession) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"garbage\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(BackendProtocolError, match="Bad status line"):
            await VLLMBackend("r1", f"http://127.0.0.1:{port}", session).chat(req())
    finally:
        server.close()
        await server.wait_closed()


# --- timeouts -------------------------------------------------------------------------------


async def test_chat_total_timeout(make: Callable[..., VLLMBackend]) -> None:
    with pytest.raises(BackendTimeout, match=r"the response \(0.1s total\)"):
        await make("hang", total_s=0.1).chat(req())


async def test_request_timeout_caps_total(make: Callable[..., VLLMBackend]) -> None:
    with pytest.raises(BackendTimeout, match=r"0.1s total"):
        await make("hang", total_s=60).chat(req(timeout_s=0.1))


async def test_stream_first_token_timeout(make: Callable[..., VLLMBackend]) -> None:
    with pytest.raises(BackendTimeout, match="first token"):
        await collect(make("hang", first_token_s=0.1, stall_s=5))


async def test_stream_stall_timeout(make: Callable[..., VLLMBackend]) -> None:
    got: list[ChatChunk] = []
    with pytest.raises(BackendTimeout, match="stall"):
        async for c in make("stall", first_token_s=5, stall_s=0.1).stream(req()):
            got.append(c)
    assert len(got) == 1


async def test_stream_total_timeout_while_chunks_flow(make: Callable[..., VLLMBackend]) -> None:
    with pytest.raises(BackendTimeout, match="total"):
        await collect(make("trickle", first_token_s=5, stall_s=5, total_s=0.2))


async def test_stall_clock_ignores_a_slow_consumer(make: Callable[..., VLLMBackend]) -> None:
    backend = make("ok", stall_s=0.05)
    got = []
    async for c in backend.stream(req()):
        await asyncio.sleep(0.1)  # longer than stall_s, but the backend was not silent
        got.append(c)
    assert len(got) == 4


async def test_closing_a_stream_early_disconnects(
    make: Callable[..., VLLMBackend], server: Server
) -> None:
    async with contextlib.aclosing(make("trickle").stream(req())) as stream:
        async for _ in stream:
            break
    await asyncio.wait_for(server.seen.disconnected.wait(), 2)


# --- SSE decoding ---------------------------------------------------------------------------


RAW = b": comment\nevent: x\ndata: a\ndata:b\n\nid: 3\ndata: [DONE]\n\n"


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_decoder_handles_every_split_point(newline: bytes) -> None:
    raw = RAW.replace(b"\n", newline)
    for cut in range(len(raw) + 1):
        decoder = SSEDecoder()
        events = decoder.feed(raw[:cut]) + decoder.feed(raw[cut:]) + decoder.flush()
        assert events == [b"a\nb", b"[DONE]"], (newline, cut)


def test_sse_decoder_flush() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: x\ndata: {"half') == []
    assert decoder.flush() == [b"x"]  # a complete data line without its blank line; half dropped
    assert decoder.feed(b"data\n\n") == [b""]


# --- against the simulator (backends/sim, conftest's start_sim) ------------------------------


async def test_against_the_simulator(start_sim: Any, session: aiohttp.ClientSession) -> None:
    from backends.sim import PROFILES

    sim = await start_sim(PROFILES["llama-3.1-70b-instruct-awq"], time_scale=0.0)
    backend = VLLMBackend("large-0", sim.base_url, session)
    request = ChatRequest(
        model="llama-3.1-70b-instruct-awq",
        body={"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8},
        request_id="sim-1",
    )
    answer = await backend.chat(request)
    chunks = await collect(backend, request)
    assert answer.usage is not None and chunks[-1].usage == answer.usage
    streamed = "".join(
        c.data["choices"][0]["delta"].get("content") or "" for c in chunks if c.data["choices"]
    )
    assert streamed == answer.body["choices"][0]["message"]["content"]

    too_long = ChatRequest(
        model=request.model, body={**request.body, "max_tokens": 9000}, request_id="sim-2"
    )
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 8192"):
        await backend.chat(too_long)

    await sim.set_faults(overloaded=True, retry_after=3)
    with pytest.raises(BackendUnavailable) as info:
        await collect(backend, request)
    assert info.value.status == 503 and info.value.retry_after == 3.0

    await sim.set_faults(cut_after_tokens=2)
    with pytest.raises(BackendStreamCut):
        await collect(backend, request)
