"""A response's status line and headers leave in one write with its first body bytes.

uvicorn writes the head of a response as soon as the app sends ``http.response.start``, and the
body at ``http.response.body``: two socket writes, two packets and two wake-ups of the client for
every answer, though the app sends both in the same turn of the event loop (a JSON answer; a
stream's headers and first event, ``gateway.api.sse``). ``HeadWithFirstBody`` stands between one
request's cycle and the connection's transport: it holds the head until the next write and sends
them joined, or sends the head alone at the end of the loop turn if nothing followed (a response
whose body comes later, or an error written whole). Interim ``100 Continue`` goes out at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["HeadWithFirstBody"]

_INTERIM = b"HTTP/1.1 1"


class HeadWithFirstBody:
    """The slice of ``asyncio.Transport`` a uvicorn request cycle uses: write, close,
    is_closing."""

    __slots__ = ("_held", "_loop", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held + data)
        elif not self._started and not data.startswith(_INTERIM):
            self._started = True  # the response's head: wait for its body
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
