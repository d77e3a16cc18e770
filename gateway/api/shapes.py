"""The wire a client speaks, over the chat answer every worker sends back.

Every model endpoint runs as a chat request (``gateway.api.edge``); its ``Shape`` turns the
chat answer into the endpoint's own: ``answer`` a ``chat.completion`` body, ``stream`` a
``StreamShape`` for one stream, which turns each ``chat.completion.chunk`` (the last one
carrying ``x_tiergate``, and ``usage`` when the client gets usage), the stream's clean end,
and its error ending into SSE bytes. Chat's own shape passes everything through; the legacy
completions' and the Responses API's are in ``gateway.api.completions_wire`` and
``gateway.api.responses_wire``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson

__all__ = ["CHAT", "ChatShape", "Shape", "StreamShape", "sse_data", "sse_event"]

DONE = b"data: [DONE]\n\n"


def sse_data(data: Mapping[str, Any]) -> bytes:
    """One ``data:`` event."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


def sse_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One named event (``event:`` then ``data:``), as the Responses API sends them."""
    return b"event: " + name.encode() + b"\n" + sse_data(data)


class StreamShape(Protocol):
    """One stream, in the client's wire (stateful: one per stream)."""

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]: ...

    def end(self) -> list[bytes]:
        """After the last chunk of a stream that finished."""
        ...

    def error(self, closing: dict[str, Any], error: Mapping[str, Any]) -> list[bytes]:
        """A stream that broke: ``closing`` is the chat chunk that would end it (its
        ``finish_reason`` ``error``), ``error`` the OpenAI error body."""
        ...


class Shape(Protocol):
    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed answer, from the ``chat.completion`` body."""
        ...

    def stream(self, request_id: str) -> StreamShape: ...

    def param(self, name: str | None) -> str | None:
        """The client's name for the chat request's field ``name`` (an error's ``param``)."""
        ...


class _ChatStream:
    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        return [sse_data(chunk)]

    def end(self) -> list[bytes]:
        return [DONE]

    def error(self, closing: dict[str, Any], error: Mapping[str, Any]) -> list[bytes]:
        return [sse_data(closing) + sse_data(error)]


class ChatShape:
    """``/v1/chat/completions``: the answer as the backend gave it."""

    _STREAM = _ChatStream()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def stream(self, request_id: str) -> StreamShape:
        return self._STREAM

    def param(self, name: str | None) -> str | None:
        return name


CHAT = ChatShape()
