"""``LiteLLMBackend``: a hosted API (OpenAI, Anthropic, ...) through ``litellm.acompletion``.

``import litellm`` takes seconds, so this module does not import it: ``load_litellm`` does, when
the first ``LiteLLMBackend`` is built (at start-up, in the app's lifespan, and only when an
external deployment is configured). It also sets litellm up as a plain library:

- ``LITELLM_LOCAL_MODEL_COST_MAP=True`` before the import: otherwise litellm fetches its model
  price map from GitHub while being imported (a network call, slow or hanging without egress,
  and prices that change under a pinned version). The copy shipped in the package is the one
  DESIGN prices from.
- telemetry off, debug banners off, no callbacks, no message logging, no per-stream logging
  thread: metrics and the ledger are tiergate's, and prompts must not linger in litellm objects.
- ``num_retries=0`` and ``max_retries=0`` on every call: the gateway retries and falls back.
- our aiohttp session as litellm's ``shared_session`` (injected, or made on first use and
  closed by ``aclose``), so connections are ours to close. litellm still caches one client
  object per (api_base, api_key, timeout); two backends with the same three share it.

Timeouts follow ``VLLMBackend``: ``first_token_s`` until the first chunk, ``stall_s`` between
chunks (counted while we wait), ``total_s`` for the call (capped by ``ChatRequest.timeout_s``),
each enforced on our side. ``connect_s`` is not enforced separately (the client litellm builds
takes one number); the first-token and total deadlines bound the connect. litellm ends a cut
stream with a ``finish_reason`` it makes up; we check that the provider sent one and raise
``BackendStreamCut`` when it did not. A non-streamed answer arrives whole, so its
``first_byte_s`` bounds the call. ``ChatRequest.first_token_s`` / ``stall_s`` override these
for one call (``math.inf``: none).

Only OpenAI chat parameters are passed to litellm as arguments; every other body field goes in
``extra_body``, sent to the provider as is. A client can therefore never set litellm's own
arguments (``api_base``, ``api_key``, ``mock_response``, ...) through its request body.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator, Mapping
from types import ModuleType
from typing import Any

import aiohttp

from backends.errors import BackendProtocolError, BackendStreamCut
from backends.http_errors import error_from_litellm
from backends.openai_http import StreamClock, forwarded_headers, has_finish_reason, host_port
from backends.types import ChatChunk, ChatRequest, ChatResponse, Usage, stream_options_with_usage

__all__ = ["OPENAI_CHAT_PARAMS", "LiteLLMBackend", "load_litellm"]

OPENAI_CHAT_PARAMS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
"""Body fields given to ``litellm.acompletion`` as arguments (it maps them per provider)."""

_log = logging.getLogger(__name__)
_SET_BY_US = frozenset({"model", "messages", "stream", "stream_options"})
_CALLBACK_LISTS = ("callbacks", "success_callback", "failure_callback", "input_callback")


def load_litellm() -> ModuleType:
    """Import litellm, configured as described in the module docstring (idempotent)."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before the import: see module doc
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    litellm.turn_off_message_logging = True
    litellm.disable_streaming_logging = True
    for attr in _CALLBACK_LISTS:
        setattr(litellm, attr, [])
    return litellm


class LiteLLMBackend:
    """One external deployment, e.g. ``litellm_model="openai/gpt-4o-mini"``."""

    def __init__(
        self,
        name: str,
        litellm_model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        connect_s: float = 5.0,
        first_token_s: float = 60.0,
        stall_s: float = 30.0,
        total_s: float = 600.0,
        first_byte_s: float | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._litellm = load_litellm()
        self._session = session
        self._owns_session = False
        self._name = name
        self._model = litellm_model
        self._api_base = api_base
        self._api_key = api_key
        del connect_s  # accepted like VLLMBackend's; not enforceable here (module docstring)
        self._first_token_s = first_token_s
        self._stall_s = stall_s
        self._total_s = total_s
        self._first_byte_s = math.inf if first_byte_s is None else first_byte_s

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str | None:
        return host_port(self._api_base) if self._api_base else None

    def __repr__(self) -> str:
        return f"LiteLLMBackend(name={self._name!r}, model={self._model!r})"

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()

    def _shared_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop, unless one was injected.
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    def _kwargs(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        body = request.body
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in body.items():
            if key in OPENAI_CHAT_PARAMS:
                kwargs[key] = value
            elif key not in _SET_BY_US:
                extra[key] = value
        if extra:
            kwargs["extra_body"] = extra
        if stream:
            kwargs["stream_options"] = stream_options_with_usage(body)
        kwargs.update(
            model=self._model,
            messages=body.get("messages", []),
            stream=stream,
            api_base=self._api_base,
            api_key=self._api_key,
            # One value per backend: litellm caches a client per distinct timeout.
            timeout=self._total_s,
            num_retries=0,
            max_retries=0,
            extra_headers=forwarded_headers(request),
            shared_session=self._shared_session(),
        )
        return kwargs

    def _total_s_for(self, request: ChatRequest) -> float:
        if request.timeout_s is None:
            return self._total_s
        return min(self._total_s, request.timeout_s)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        loop = asyncio.get_running_loop()
        total_s = self._total_s_for(request)
        # A hosted API sends its first byte with the whole answer: the first-byte limit is the
        # call's limit.
        first_byte_s = request.first_token_s
        if first_byte_s is None:
            first_byte_s = self._first_byte_s
        waiting_for = f"the response ({total_s:g}s total)"
        if first_byte_s < total_s:
            total_s, waiting_for = first_byte_s, f"the response's first byte ({first_byte_s:g}s)"
        try:
            async with asyncio.timeout_at(loop.time() + total_s):
                response = await self._litellm.acompletion(**self._kwargs(request, stream=False))
        except Exception as exc:  # every litellm failure is translated, none escapes
            raise error_from_litellm(
                exc, backend=self._name, stream_started=False, waiting_for=waiting_for
            ) from exc
        body = _dump(response)
        if body is None:
            raise BackendProtocolError(f"unexpected {type(response).__name__}", backend=self._name)
        return ChatResponse(body, Usage.from_openai(body.get("usage")))

    async def stream(self, request: ChatRequest) -> AsyncIterator[ChatChunk]:
        clock = StreamClock(
            asyncio.get_running_loop(),
            first_token_s=(
                self._first_token_s if request.first_token_s is None else request.first_token_s
            ),
            stall_s=self._stall_s if request.stall_s is None else request.stall_s,
            total_s=self._total_s_for(request),
        )
        try:
            async with asyncio.timeout_at(clock.deadline):
                wrapper = await self._litellm.acompletion(**self._kwargs(request, stream=True))
        except Exception as exc:  # every litellm failure is translated, none escapes
            raise error_from_litellm(
                exc, backend=self._name, stream_started=False, waiting_for=clock.waiting_for
            ) from exc
        try:
            async for chunk in self._chunks(wrapper, clock):
                yield chunk
        finally:
            close = getattr(wrapper, "aclose", None)
            if close is not None:
                await close()  # releases the HTTP connection when we stop early

    async def _chunks(self, wrapper: Any, clock: StreamClock) -> AsyncIterator[ChatChunk]:
        started = finished = False
        while True:
            try:
                async with asyncio.timeout_at(clock.deadline):
                    item = await anext(wrapper)
            except StopAsyncIteration:
                break
            except Exception as exc:  # every litellm failure is translated, none escapes
                if finished:  # the answer is complete; only the usage tail was lost
                    _log.warning("%s: stream failed after its finish_reason: %r", self._name, exc)
                    return
                raise error_from_litellm(
                    exc, backend=self._name, stream_started=started, waiting_for=clock.waiting_for
                ) from exc
            data = _dump(item)
            if data is None:
                raise BackendProtocolError(f"unexpected {type(item).__name__}", backend=self._name)
            if not finished and has_finish_reason(data):
                if not _provider_finished(wrapper):
                    # litellm closes a cut stream with a finish_reason of its own making
                    raise BackendStreamCut(
                        "stream ended before a finish_reason", backend=self._name, status=200
                    )
                finished = True
            started = True
            data = _usage_alone(data)
            yield ChatChunk(data, Usage.from_openai(data.get("usage")))
            clock.chunk_received()
        if not finished:
            raise BackendStreamCut(
                "stream ended before a finish_reason", backend=self._name, status=200
            )


def _provider_finished(wrapper: Any) -> bool:
    """Whether the provider itself sent a finish reason (litellm's CustomStreamWrapper)."""
    return bool(
        getattr(wrapper, "received_finish_reason", None)
        or getattr(wrapper, "intermittent_finish_reason", None)
    )


def _usage_alone(data: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's shape for the usage chunk: no choices. litellm re-emits the provider's usage chunk
    with one empty choice (a delta of nulls, no finish_reason), which a client, and the edge's
    relay, take for a content chunk: the relay then sent it before the held finish_reason chunk,
    so the stream's last chunk had no usage."""
    choices = data.get("choices")
    if data.get("usage") and choices and all(_empty_choice(c) for c in choices):
        return {**data, "choices": []}
    return data


def _empty_choice(choice: Mapping[str, Any]) -> bool:
    delta = choice.get("delta") or {}
    return not choice.get("finish_reason") and not any(delta.values())


_LITELLM_ONLY = "provider_specific_fields"
"""litellm's own field, on the response, each choice and each message or delta: what the
provider said beyond OpenAI's schema, in litellm's words. Not OpenAI's wire format, and not the
client's business (which provider answered is tiergate's to tell, in ``x-tiergate-model``)."""


def _dump(obj: Any) -> dict[str, Any] | None:
    """litellm's pydantic response objects as plain JSON-ready dicts, in OpenAI's shape
    (without ``provider_specific_fields``)."""
    dump = getattr(obj, "model_dump", None)
    if dump is None:
        return None
    data = dump()
    if not isinstance(data, dict):
        return None
    data.pop(_LITELLM_ONLY, None)
    choices = data.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict):
            choice.pop(_LITELLM_ONLY, None)
            for part in ("message", "delta"):
                if isinstance(choice.get(part), dict):
                    choice[part].pop(_LITELLM_ONLY, None)
    return data
