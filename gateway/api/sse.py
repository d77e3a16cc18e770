"""An SSE response whose headers and first event leave at once, from the handler's task.

Starlette's ``StreamingResponse`` (under an ASGI server of spec < 2.4, as uvicorn is) starts a
task group to listen for the client leaving and sends the headers and the first chunk from a
task of it, a loop turn later. A stream's first event is already known when the response is
made (the relay waits for it: it carries the routing headers), so this one sends both before
that set-up, saving the time to first token the task group costs; the rest streams as
Starlette does, and a client leaving still cancels it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["EventStreamResponse"]


class EventStreamResponse(StreamingResponse):
    def __init__(
        self, first: bytes, rest: AsyncIterator[bytes], *, headers: Mapping[str, str]
    ) -> None:
        super().__init__(rest, media_type="text/event-stream", headers=headers)
        self._first = first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self._first, "more_body": True})
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        """The rest (headers and first event are out)."""
        async for chunk in self.body_iterator:
            body = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
