"""One ``/v1/responses`` stream: chat chunks in, the Responses API's events out.

``response.created`` and ``response.in_progress`` come with the first chunk. Each output item
opens when its first piece arrives, and closes when the next one opens or the answer ends, as
OpenAI streams them: text opens a ``message`` item (``response.output_item.added``,
``response.content_part.added``, then ``response.output_text.delta`` per chunk; closed by
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``);
a chat tool call opens a ``function_call`` item (added with empty ``arguments``, then
``response.function_call_arguments.delta`` per piece of its arguments; closed by
``response.function_call_arguments.done`` and ``response.output_item.done``). Then
``response.completed`` (``response.incomplete`` when the output limit cut the answer) with
every item; or, when the stream broke, ``response.failed`` and an ``error`` event.
``sequence_number`` counts the events from 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.api.responses_items import (
    call_item_id,
    function_call_item,
    response_usage,
    text_item,
)
from gateway.api.shapes import sse_event

__all__ = ["ResponsesStream"]

Respond = Callable[..., dict[str, Any]]
"""``ResponsesShape.response``: a ``response`` object from its id, status, output, ..."""


@dataclass(slots=True)
class _Item:
    """One output item as it streams: text (``call_id`` ``None``) or a function call."""

    index: int
    id: str
    call_id: str | None = None
    name: str = ""
    parts: list[str] = field(default_factory=list)
    done: bool = False

    def body(self, status: str) -> dict[str, Any]:
        if self.call_id is None:
            return text_item(self.id, "".join(self.parts), status)
        return function_call_item(self.id, self.call_id, self.name, "".join(self.parts), status)


class ResponsesStream:
    """One stream's events (stateful: one per stream)."""

    def __init__(self, respond: Respond, base: str) -> None:
        self._respond = respond
        self._base = base
        self._id = f"resp_{base}"
        self._seq = 0
        self._started = False
        self._created = int(time.time())
        self._model: Any = None
        self._items: list[_Item] = []
        self._calls: dict[int, _Item] = {}
        self._finish: Any = None
        self._usage: dict[str, Any] | None = None
        self._extra: dict[str, Any] = {}

    def _event(self, name: str, **fields: Any) -> bytes:
        data = {"type": name, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(name, data)

    def _response(self, status: str, **kwargs: Any) -> dict[str, Any]:
        response = self._respond(
            self._id, created_at=self._created, model=self._model, status=status, **kwargs
        )
        return {**response, **self._extra}

    def _opening(self) -> list[bytes]:
        self._started = True
        return [
            self._event("response.created", response=self._response("in_progress", output=[])),
            self._event("response.in_progress", response=self._response("in_progress", output=[])),
        ]

    def _close(self, status: str = "completed") -> list[bytes]:
        """Close the open item, if any."""
        item = self._items[-1] if self._items else None
        if item is None or item.done:
            return []
        item.done = True
        body = item.body(status)
        where = {"item_id": item.id, "output_index": item.index}
        if item.call_id is None:
            closing = [
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=body["content"][0]["text"],
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", **where, content_index=0, part=body["content"][0]
                ),
            ]
        else:
            closing = [
                self._event(
                    "response.function_call_arguments.done", **where, arguments=body["arguments"]
                )
            ]
        return [
            *closing,
            self._event("response.output_item.done", output_index=item.index, item=body),
        ]

    def _open(self, item: _Item) -> list[bytes]:
        out = self._close()
        self._items.append(item)
        added = item.body("in_progress")
        if item.call_id is None:
            part = added["content"][0]
            added["content"] = []
            where = {"item_id": item.id, "output_index": item.index}
            return [
                *out,
                self._event("response.output_item.added", output_index=item.index, item=added),
                self._event("response.content_part.added", **where, content_index=0, part=part),
            ]
        return [
            *out,
            self._event("response.output_item.added", output_index=item.index, item=added),
        ]

    def _text(self, delta: str) -> list[bytes]:
        item = self._items[-1] if self._items else None
        out: list[bytes] = []
        if item is None or item.done or item.call_id is not None:
            texts = sum(1 for i in self._items if i.call_id is None)
            item_id = f"msg_{self._base}" + (f"_{texts}" if texts else "")
            item = _Item(len(self._items), item_id)
            out = self._open(item)
        item.parts.append(delta)
        where = {"item_id": item.id, "output_index": item.index}
        delta_event = self._event(
            "response.output_text.delta", **where, content_index=0, delta=delta, logprobs=[]
        )
        return [*out, delta_event]

    def _tool_call(self, call: Mapping[str, Any]) -> list[bytes]:
        index = call.get("index")
        if not isinstance(index, int):  # a backend that leaves it out: a new id, a new call
            index = len(self._calls) - (0 if call.get("id") or not self._calls else 1)
        function = call.get("function") or {}
        item = self._calls.get(index)
        out: list[bytes] = []
        if item is None:
            call_id = call.get("id") or f"call_{self._base}_{index}"
            item = _Item(len(self._items), call_item_id(self._base, index), str(call_id))
            item.name = str(function.get("name") or "")
            self._calls[index] = item
            out = self._open(item)
        elif not item.name and isinstance(function.get("name"), str):
            item.name = function["name"]  # a backend that names the call after opening it
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.parts.append(arguments)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=item.index,
                    delta=arguments,
                )
            )
        return out

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        if self._model is None:
            self._model = chunk.get("model")
        out = [] if self._started else self._opening()
        if chunk.get("usage"):
            self._usage = response_usage(chunk["usage"])
        if "x_tiergate" in chunk:
            self._extra["x_tiergate"] = chunk["x_tiergate"]
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.extend(self._text(delta["content"]))
            for call in delta.get("tool_calls") or []:
                if isinstance(call, Mapping):
                    out.extend(self._tool_call(call))
        return out

    def end(self) -> list[bytes]:
        out = [] if self._started else self._opening()
        if not self._items:  # an answer with nothing in it: an empty message, as before
            out.extend(self._open(_Item(0, f"msg_{self._base}")))
        last = self._items[-1]
        cut = self._finish == "length"

        def status(item: _Item) -> str:  # a function call the output limit cut is incomplete
            return "incomplete" if cut and item is last and item.call_id else "completed"

        out.extend(self._close(status(last)))
        response = self._response(
            "completed",
            output=[item.body(status(item)) for item in self._items],
            usage=self._usage,
            finish_reason=self._finish,
        )
        final = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [*out, self._event(final, response=response)]

    def error(self, closing: dict[str, Any], error: Mapping[str, Any]) -> list[bytes]:
        """``response.failed``, then an ``error`` event (with the OpenAI error body, on which
        the SDK raises ``APIError``)."""
        out = self.chunk(closing)
        body = dict(error.get("error") or {})
        items = self._items or [_Item(0, f"msg_{self._base}")]
        failed = self._response(
            "failed",
            output=[item.body("completed" if item.done else "incomplete") for item in items],
            usage=self._usage,
            error={"code": body.get("code"), "message": body.get("message")},
        )
        return [
            *out,
            self._event("response.failed", response=failed),
            self._event(
                "error",
                code=body.get("code"),
                message=body.get("message"),
                param=body.get("param"),
                error=body,
            ),
        ]
