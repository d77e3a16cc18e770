"""A backend whose answers are scripted, for tests of the code above a backend (like httpx's
``MockTransport``): no server, no socket, every call recorded.

    backend = ScriptedBackend("small#0", [
        reply("Hello!", prompt_tokens=9, completion_tokens=2),     # the first call
        BackendUnavailable("overloaded", status=503),              # the second: raised
        [Pause(0.5), reply("late")],                               # the third, after 0.5 s
        [*stream_of("Hel", "lo"), BackendStreamCut("cut")],        # a stream cut mid-way
    ])
    backend = ScriptedBackend("small#0", lambda request: reply(request.model))  # a function

An answer is one step or a sequence of steps, taken in order: a ``Pause`` waits, a
``BackendError`` is raised, a ``ChatResponse`` ends a ``chat`` call, a ``ChatChunk`` is
yielded by a ``stream`` call. A script is a sequence of answers (one per call, ``chat`` and
``stream`` alike, in the order the calls come; ``ScriptExhausted`` after the last) or a
function of the ``ChatRequest`` (sync or async) returning the answer. ``calls`` lists what the
backend was asked, in order. ``sleep`` is injected: a test can take pauses without waiting.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from backends.errors import BackendError
from backends.types import ChatChunk, ChatRequest, ChatResponse, Usage

__all__ = [
    "Answer",
    "Call",
    "Pause",
    "ScriptExhausted",
    "ScriptedBackend",
    "Step",
    "reply",
    "stream_of",
]


@dataclass(frozen=True, slots=True)
class Pause:
    """A wait of ``seconds`` before the next step (a slow first token, a stall mid-stream)."""

    seconds: float


Step: TypeAlias = ChatResponse | ChatChunk | BackendError | Pause
Answer: TypeAlias = Step | Sequence[Step]
Handler: TypeAlias = Callable[[ChatRequest], Answer | Awaitable[Answer]]


@dataclass(frozen=True, slots=True)
class Call:
    """One call the backend got: ``chat`` or ``stream``, and its request."""

    kind: Literal["chat", "stream"]
    request: ChatRequest


class ScriptExhausted(Exception):
    """A call came after the script's last answer: the test expected fewer calls. Not a
    ``BackendError`` on purpose: nothing above a backend handles it."""


class ScriptedBackend:
    """A ``Backend`` (``backends.protocol``) that answers from a script."""

    def __init__(
        self,
        name: str,
        script: Sequence[Answer] | Handler,
        *,
        address: str | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._name = name
        self._address = address
        self._sleep = sleep
        self._handler = script if callable(script) else None
        self._script: Iterator[Answer] = iter(()) if callable(script) else iter(script)
        self.calls: list[Call] = []
        self.closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str | None:
        return self._address

    @property
    def requests(self) -> list[ChatRequest]:
        """The requests of ``calls``, in order."""
        return [call.request for call in self.calls]

    async def chat(self, request: ChatRequest) -> ChatResponse:
        for step in await self._answer(Call("chat", request)):
            if isinstance(step, ChatResponse):
                return step
            await self._take(step, "chat")
        raise TypeError(f"{self._name}: a chat answer must end with a ChatResponse")

    async def stream(self, request: ChatRequest) -> AsyncIterator[ChatChunk]:
        for step in await self._answer(Call("stream", request)):
            if isinstance(step, ChatChunk):
                yield step
            else:
                await self._take(step, "stream")

    async def aclose(self) -> None:
        self.closed = True

    async def _answer(self, call: Call) -> Sequence[Step]:
        self.calls.append(call)
        if self._handler is not None:
            answer = self._handler(call.request)
            if inspect.isawaitable(answer):
                answer = await answer
        else:
            try:
                answer = next(self._script)
            except StopIteration:
                raise ScriptExhausted(
                    f"{self._name}: call {len(self.calls)} ({call.kind}) is past the script"
                ) from None
        if isinstance(answer, ChatResponse | ChatChunk | BackendError | Pause):
            return (answer,)
        return answer

    async def _take(self, step: Step, kind: str) -> None:
        if isinstance(step, Pause):
            await self._sleep(step.seconds)
        elif isinstance(step, BackendError):
            if not step.backend:
                step.backend = self._name
            raise step
        else:
            raise TypeError(f"{self._name}: a {kind} answer cannot hold {type(step).__name__}")


def reply(
    text: str,
    *,
    model: str = "scripted",
    prompt_tokens: int = 10,
    completion_tokens: int | None = None,
    finish_reason: str = "stop",
) -> ChatResponse:
    """A non-streamed answer in OpenAI's shape, with its usage (``completion_tokens``: one a
    word of ``text`` unless given)."""
    completion = len(text.split()) if completion_tokens is None else completion_tokens
    usage = Usage(prompt_tokens, completion)
    body = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
    }
    return ChatResponse(body=body, usage=usage)


def stream_of(
    *pieces: str,
    model: str = "scripted",
    prompt_tokens: int = 10,
    completion_tokens: int | None = None,
    finish_reason: str = "stop",
) -> list[ChatChunk]:
    """A whole streamed answer in OpenAI's shape: a chunk a piece of text, one with the
    ``finish_reason``, then the usage chunk (``completion_tokens``: one a piece unless given).
    Leave out its tail, or add a ``BackendError``, for a stream that breaks."""
    completion = len(pieces) if completion_tokens is None else completion_tokens
    usage = Usage(prompt_tokens, completion)

    def chunk(choices: list[dict[str, object]], **extra: object) -> dict[str, object]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": choices,
            **extra,
        }

    chunks = [
        ChatChunk(chunk([{"index": 0, "delta": {"content": piece}, "finish_reason": None}]))
        for piece in pieces
    ]
    chunks.append(ChatChunk(chunk([{"index": 0, "delta": {}, "finish_reason": finish_reason}])))
    usage_body = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    chunks.append(ChatChunk(chunk([], usage=usage_body), usage=usage))
    return chunks
