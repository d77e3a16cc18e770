"""``VLLMBackend``: one vLLM (or any OpenAI-compatible) server, spoken to over aiohttp.

aiohttp because it is the cheapest client per call (``bench/client_overhead.py``), orjson for
both directions. The session is injected and shared by every backend of the process (one
connection pool); ``VLLMBackend.create`` makes a backend that owns a session of its own.

Deadlines (event-loop clock; ``BackendTimeout`` says which one expired):

    connect_s       opening a new TCP connection (aiohttp ``sock_connect``)
    first_token_s   stream: from the start until the first chunk (covers vLLM's queueing and
                    prefill)
    first_byte_s    ``chat``: from the start until the response's status line (vLLM sends it
                    with the whole answer); ``None``: only ``total_s``
    stall_s         stream: longest silence between two chunks, counted while this generator
                    waits for the backend (not while the consumer holds a chunk)
    total_s         the whole call, capped by ``ChatRequest.timeout_s`` when that is set

``ChatRequest.first_token_s`` (first chunk or first byte) and ``ChatRequest.stall_s`` override
the backend's own for one call (``math.inf``: no such limit).

A stream that ends before a chunk with a ``finish_reason`` or ``data: [DONE]`` raises
``BackendStreamCut``; an error event inside it raises what the same body would as a response.
Streams always ask for ``stream_options.include_usage`` (``stream_options_with_usage``: the
last chunk then carries the usage billing needs) and vLLM's ``continuous_usage_stats`` (every
chunk carries the usage so far, so a stream that breaks still says what it cost: its prompt
tokens and the completion tokens up to the break). Each chunk's usage is in
``ChatChunk.usage``; it is left in the chunk's ``data`` only when the caller asked for
continuous usage itself. Non-streamed requests drop ``stream_options``, which vLLM rejects
there.

Consumers of ``stream`` that stop early should close the generator (``contextlib.aclosing``):
that closes the connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from yarl import URL

from backends.errors import BackendProtocolError, BackendStreamCut
from backends.http_errors import error_from_aiohttp, error_from_payload, error_from_response
from backends.sse import DONE, SSEDecoder
from backends.types import (
    ChatChunk,
    ChatRequest,
    ChatResponse,
    Usage,
    stream_options_with_usage,
)

__all__ = [
    "StreamClock",
    "VLLMBackend",
    "chat_completions_url",
    "forwarded_headers",
    "has_finish_reason",
    "host_port",
]

_log = logging.getLogger(__name__)
_CLIENT_ERRORS = (aiohttp.ClientError, OSError)  # OSError includes TimeoutError
_SSE_TYPE = "text/event-stream"
_DRAIN_S = 0.25  # how long to wait for the end of a body after [DONE]


def chat_completions_url(base_url: str) -> URL:
    """``{base_url}/v1/chat/completions``; a ``base_url`` already ending in ``/v1`` is fine."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return URL(base + "/chat/completions")


def host_port(url: URL | str) -> str | None:
    """``host:port`` of ``url`` (the scheme's default port when it names none)."""
    parsed = URL(url) if isinstance(url, str) else url
    return f"{parsed.host}:{parsed.port}" if parsed.host and parsed.port else None


class VLLMBackend:
    """One replica of a vLLM deployment (see the module docstring for the timeouts)."""

    def __init__(
        self,
        name: str,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        api_key: str | None = None,
        connect_s: float = 5.0,
        first_token_s: float = 60.0,
        stall_s: float = 30.0,
        total_s: float = 600.0,
        first_byte_s: float | None = None,
    ) -> None:
        self._name = name
        self._url = chat_completions_url(base_url)
        self._embeddings_url = self._url.with_path(self._url.path.rsplit("/", 2)[0] + "/embeddings")
        self._session = session
        self._owns_session = False  # True only when made by ``create``
        self._headers: dict[str, str] = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._connect_s = connect_s
        self._first_token_s = first_token_s
        self._stall_s = stall_s
        self._total_s = total_s
        self._first_byte_s = math.inf if first_byte_s is None else first_byte_s
        self._client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s)

    @classmethod
    def create(
        cls,
        name: str,
        base_url: str,
        *,
        max_connections: int = 256,
        **kwargs: Any,
    ) -> VLLMBackend:
        """A backend with its own session, closed by ``aclose``. Call inside a running loop."""
        connector = aiohttp.TCPConnector(limit=max_connections, ttl_dns_cache=300)
        session = aiohttp.ClientSession(connector=connector)
        backend = cls(name, base_url, session, **kwargs)
        backend._owns_session = True
        return backend

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str | None:
        return host_port(self._url)

    def __repr__(self) -> str:
        return f"VLLMBackend(name={self._name!r}, url={str(self._url)!r})"

    async def aclose(self) -> None:
        if self._owns_session:
            await self._session.close()

    def _payload(self, request: ChatRequest, *, stream: bool) -> bytes:
        body = dict(request.body)
        body["model"] = request.model
        if request.endpoint == "embeddings":
            return orjson.dumps(body)
        body["stream"] = stream
        if stream:
            # Usage at the end (``stream_options_with_usage``) and in every chunk.
            options = stream_options_with_usage(body)
            body["stream_options"] = {**options, "continuous_usage_stats": True}
        else:
            body.pop("stream_options", None)  # vLLM rejects it on non-streamed requests
        return orjson.dumps(body)

    def _request_headers(self, request: ChatRequest) -> dict[str, str]:
        headers = forwarded_headers(request)
        headers.update(self._headers)
        return headers

    def _total_s_for(self, request: ChatRequest) -> float:
        if request.timeout_s is None:
            return self._total_s
        return min(self._total_s, request.timeout_s)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        loop = asyncio.get_running_loop()
        total_s = self._total_s_for(request)
        first_byte_s = _limit(request.first_token_s, self._first_byte_s)
        data = self._payload(request, stream=False)
        waiting_for = f"the response ({total_s:g}s total)"
        started = loop.time()
        try:
            async with asyncio.timeout_at(started + total_s):
                if first_byte_s < total_s:
                    waiting_for = f"the response's first byte ({first_byte_s:g}s)"
                async with asyncio.timeout_at(started + min(first_byte_s, total_s)):
                    resp = await self._session.post(
                        self._embeddings_url if request.endpoint == "embeddings" else self._url,
                        data=data,
                        headers=self._request_headers(request),
                        timeout=self._client_timeout,
                        allow_redirects=False,
                    )
                waiting_for = f"the response ({total_s:g}s total)"
                try:
                    raw = await resp.read()
                    status, headers = resp.status, resp.headers
                finally:
                    resp.release()
        except _CLIENT_ERRORS as exc:
            raise error_from_aiohttp(
                exc, backend=self._name, body_started=False, waiting_for=waiting_for
            ) from exc
        if status != 200:
            raise error_from_response(status, headers, raw, backend=self._name)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BackendProtocolError(
                f"response is not JSON: {raw[:200]!r}", backend=self._name, status=status
            ) from exc
        if not isinstance(body, dict):
            raise BackendProtocolError("response is not a JSON object", backend=self._name)
        return ChatResponse(body, Usage.from_openai(body.get("usage")))

    async def stream(self, request: ChatRequest) -> AsyncIterator[ChatChunk]:
        clock = StreamClock(
            asyncio.get_running_loop(),
            first_token_s=_limit(request.first_token_s, self._first_token_s),
            stall_s=_limit(request.stall_s, self._stall_s),
            total_s=self._total_s_for(request),
        )
        data = self._payload(request, stream=True)
        try:
            async with asyncio.timeout_at(clock.deadline):
                resp = await self._session.post(
                    self._url,
                    data=data,
                    headers=self._request_headers(request),
                    timeout=self._client_timeout,
                    allow_redirects=False,
                )
        except _CLIENT_ERRORS as exc:
            raise error_from_aiohttp(
                exc, backend=self._name, body_started=False, waiting_for=clock.waiting_for
            ) from exc
        keep_usage = _asks_continuous_usage(request.body)
        try:
            await self._check_stream_response(resp, clock)
            async for chunk in self._read_events(resp.content, clock, keep_usage):
                yield chunk
        finally:
            resp.release()  # back to the pool if the body was read to its end, else closed

    async def _read_events(
        self, content: aiohttp.StreamReader, clock: StreamClock, keep_usage: bool
    ) -> AsyncIterator[ChatChunk]:
        decoder = SSEDecoder()
        seen_chunk = finished = False
        while True:
            try:
                async with asyncio.timeout_at(clock.deadline):
                    raw = await content.readany()
            except _CLIENT_ERRORS as exc:
                if finished:  # the answer is complete; only the usage / [DONE] tail was lost
                    _log.warning("%s: stream failed after its finish_reason: %r", self._name, exc)
                    return
                raise error_from_aiohttp(
                    exc, backend=self._name, body_started=True, waiting_for=clock.waiting_for
                ) from exc
            events = decoder.feed(raw) if raw else decoder.flush()
            for event in events:
                if event == DONE:
                    await _drain(content, clock)
                    return
                chunk = self._parse_chunk(event, keep_usage)
                finished = finished or has_finish_reason(chunk.data)
                seen_chunk = True
                yield chunk
            if not raw:  # end of body
                if finished:
                    return
                raise BackendStreamCut(
                    "stream ended before a finish_reason or [DONE]"
                    if seen_chunk
                    else "stream ended before its first chunk",
                    backend=self._name,
                    status=200,
                )
            if events:
                clock.chunk_received()

    async def _check_stream_response(
        self, resp: aiohttp.ClientResponse, clock: StreamClock
    ) -> None:
        """Raise the error that a non-SSE answer to a streamed request means."""
        content_type = resp.headers.get("Content-Type", "")
        if resp.status == 200 and (not content_type or content_type.startswith(_SSE_TYPE)):
            return
        try:
            async with asyncio.timeout_at(clock.deadline):
                raw = await resp.read()
        except _CLIENT_ERRORS as exc:
            raise error_from_aiohttp(
                exc, backend=self._name, body_started=False, waiting_for=clock.waiting_for
            ) from exc
        if resp.status != 200:
            raise error_from_response(resp.status, resp.headers, raw, backend=self._name)
        raise BackendProtocolError(
            f"asked for a stream, got {content_type}", backend=self._name, status=200
        )

    def _parse_chunk(self, event: bytes, keep_usage: bool = True) -> ChatChunk:
        """One event's chunk; ``keep_usage`` off: a chunk with choices loses its (continuous)
        ``usage`` from ``data`` (it stays in ``ChatChunk.usage``)."""
        try:
            data = orjson.loads(event)
        except orjson.JSONDecodeError as exc:
            raise BackendProtocolError(
                f"stream event is not JSON: {event[:200]!r}", backend=self._name, status=200
            ) from exc
        if not isinstance(data, dict):
            raise BackendProtocolError("stream event is not a JSON object", backend=self._name)
        error = error_from_payload(data, backend=self._name)
        if error is not None:
            raise error
        usage = Usage.from_openai(data.get("usage"))
        if not keep_usage and data.get("choices") and "usage" in data:
            del data["usage"]  # asked for billing, not by the caller
        return ChatChunk(data, usage)


class StreamClock:
    """The deadline a stream's next read must meet, and what it is waiting for then."""

    __slots__ = (
        "_first_token_s",
        "_loop",
        "_phase",
        "_stall_s",
        "_total_at",
        "_total_s",
        "deadline",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        first_token_s: float,
        stall_s: float,
        total_s: float,
    ) -> None:
        now = loop.time()
        self._loop = loop
        self._first_token_s = first_token_s
        self._stall_s = stall_s
        self._total_s = total_s
        self._total_at = now + total_s
        self._phase = "first"
        self.deadline = now + first_token_s
        if self.deadline >= self._total_at:
            self.deadline, self._phase = self._total_at, "total"

    def chunk_received(self) -> None:
        """Restart the stall timer (call it when the consumer asks for the next chunk)."""
        deadline = self._loop.time() + self._stall_s
        if deadline < self._total_at:
            self.deadline, self._phase = deadline, "stall"
        else:
            self.deadline, self._phase = self._total_at, "total"

    @property
    def waiting_for(self) -> str:
        """For the timeout message: which deadline the next read is held to."""
        if self._phase == "first":
            return f"the first token ({self._first_token_s:g}s)"
        if self._phase == "stall":
            return f"the next chunk ({self._stall_s:g}s stall)"
        return f"the end of the stream ({self._total_s:g}s total)"


async def _drain(content: aiohttp.StreamReader, clock: StreamClock) -> None:
    """After ``[DONE]``, read the end of the chunked body (briefly) so that the connection can
    go back to the pool; a server that keeps the body open only costs its connection."""
    if content.at_eof():
        return
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(min(clock.deadline, loop.time() + _DRAIN_S)):
            while await content.readany():
                pass
    except _CLIENT_ERRORS:
        pass  # the answer is complete either way


_CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})


def forwarded_headers(request: ChatRequest) -> dict[str, str]:
    """``request.headers`` plus ``x-request-id``, minus any credential header: the backend's
    key is the adapter's to set, and a caller's key must never reach a backend."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
    headers["x-request-id"] = request.request_id
    return headers


def _limit(override: float | None, own: float) -> float:
    """A call's limit: the request's ``override`` when it sets one, else the backend's."""
    return own if override is None else override


def _asks_continuous_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("continuous_usage_stats") is True


def has_finish_reason(data: Mapping[str, Any]) -> bool:
    choices = data.get("choices")
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, Mapping) and c.get("finish_reason") for c in choices)
