"""Header-size limit at the HTTP protocol, before the app (or much memory) is involved.

uvicorn's httptools protocol accepts request heads of any size (8 MB was taken in a test). This
subclass counts the bytes of the request head as they arrive and, once past the limit, answers
431 with an OpenAI error body and closes the connection; so memory per connection stays within
the limit plus one read. The h11 protocol gets the same limit through
``h11_max_incomplete_event_size`` (see ``gateway.server``).

The same protocol class also gives each request's cycle a ``HeadWithFirstBody`` transport, so a
response's head and first body bytes leave in one write.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.api.errors import raw_error_response
from gateway.api.head_with_body import HeadWithFirstBody
from gateway.errors import HeadersTooLarge

__all__ = ["limited_httptools"]


class _LimitedHttpTools(HttpToolsProtocol):
    max_head_bytes = 16 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._too_large = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.max_head_bytes:
            self._too_large = True
            raise ValueError("request head too large")  # httptools turns this into a parse error
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, HeadWithFirstBody):
            # One write for the response's head and its first body bytes (head_with_body.py).
            cycle.transport = HeadWithFirstBody(self.transport, self.loop)  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_head_bytes:
            # Everything read since the message began is still head: refuse without buffering
            # more (a read that also began the message is not counted: one read of slack).
            self._too_large = True
            self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        if not self._too_large:
            super().send_400_response(msg)
            return
        if self.transport.is_closing():
            return
        error = HeadersTooLarge(
            f"the request line and headers exceed the limit of {self.max_head_bytes} bytes"
        )
        self.transport.write(raw_error_response(error))
        self.transport.close()


def limited_httptools(max_head_bytes: int) -> type[HttpToolsProtocol]:
    """The httptools protocol class with this head limit (uvicorn takes a class for ``http``)."""
    return type("LimitedHttpTools", (_LimitedHttpTools,), {"max_head_bytes": max_head_bytes})
