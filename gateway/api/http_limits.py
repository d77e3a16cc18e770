"""Limits on the request head and body at the HTTP protocol, before the app (or much memory or
time) is involved.

Size: uvicorn's httptools protocol accepts request heads of any size (8 MB was taken in a test).
This subclass counts the bytes of the request head as they arrive and, once past the limit,
answers 431 with an OpenAI error body and closes the connection; so memory per connection stays
within the limit plus one read. The h11 protocol gets the same limit through
``h11_max_incomplete_event_size`` (see ``gateway.server``).

Time: uvicorn has no read timeout for a request (only the idle keep-alive timeout between
requests, and none at all before a connection's first request), so a client trickling its
headers or its body a byte at a time held a connection, and the request's task, for as long as
it liked. Here one timer per connection bounds the head (``head_timeout_s`` from a request's
first byte) and then the whole body (``body_timeout_s`` after the head); a new connection that
sends nothing is closed after the keep-alive timeout, like an idle one between requests. When it
fires before the app has started an answer, the client gets 408 ``request_timeout`` and the
app's ``receive`` says the client went away; a connection whose answer has started is just
closed. Both ports use this protocol (``gateway.server``).

The same protocol class also gives each request's cycle a ``HeadWithFirstBody`` transport, so a
response's head and first body bytes leave in one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.api.errors import raw_error_response
from gateway.api.head_with_body import HeadWithFirstBody
from gateway.errors import HeadersTooLarge, RequestTimeout

__all__ = ["limited_httptools"]


class _LimitedHttpTools(HttpToolsProtocol):
    max_head_bytes = 16 * 1024
    head_timeout_s = 10.0
    body_timeout_s = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._too_large = False
        self._head_begun = False
        self._read_timer: asyncio.TimerHandle | None = None

    # -- read timeouts ----------------------------------------------------------------------

    def _arm(self, after_s: float, expired: Callable[[], None]) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(after_s, expired)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Idle until a request's first byte: kept as long as between requests (keep-alive), so
        # a load balancer's pre-opened connection is not closed under it.
        self._arm(self.timeout_keep_alive, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _head_expired(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self._head_begun:
            self.transport.write(
                raw_error_response(
                    RequestTimeout(
                        f"the request line and headers did not arrive within "
                        f"{self.head_timeout_s:g} s"
                    )
                )
            )
        self.transport.close()

    def _body_expired(self) -> None:
        self._read_timer = None
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if cycle is not None and not cycle.response_started:
            self.transport.write(
                raw_error_response(
                    RequestTimeout(
                        f"the request body did not arrive within {self.body_timeout_s:g} s"
                    )
                )
            )
        if cycle is not None:
            # The app's next receive() says the client went away; anything it sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    # -- parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._head_begun = True
        self._arm(self.head_timeout_s, self._head_expired)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_begun = False
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.max_head_bytes:
            self._too_large = True
            raise ValueError("request head too large")  # httptools turns this into a parse error
        # The body, if any, from now on (a request without one completes in this same read).
        self._arm(self.body_timeout_s, self._body_expired)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, HeadWithFirstBody):
            # One write for the response's head and its first body bytes (head_with_body.py).
            cycle.transport = HeadWithFirstBody(self.transport, self.loop)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

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


def limited_httptools(
    max_head_bytes: int, *, head_timeout_s: float = 10.0, body_timeout_s: float = 30.0
) -> type[HttpToolsProtocol]:
    """The httptools protocol class with these limits (uvicorn takes a class for ``http``)."""
    return type(
        "LimitedHttpTools",
        (_LimitedHttpTools,),
        {
            "max_head_bytes": max_head_bytes,
            "head_timeout_s": head_timeout_s,
            "body_timeout_s": body_timeout_s,
        },
    )
