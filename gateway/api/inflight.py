"""A per-process cap on the chat requests held at once: what bounds a gateway's memory when
clients send faster than the models answer.

The queue bounds the *work* (a tier's lane over ``queue.max_depth`` refuses with 429), but every
request an edge holds (its body, its parsed messages, its connection) costs memory in that edge
until its answer's last byte is out, whether it waits in the queue, runs, or streams. With many
edges behind one queue, or a burst of large bodies, that is unbounded per process. So each edge
counts the chat requests it holds (``CountInflight``, from the request's first byte to its
response's last, streams included) and refuses one more over ``limits.max_inflight_requests``
with ``503 overloaded`` and ``Retry-After``, after authentication and before reading the body:
the refusal is booked like any other, and the body is never read into memory.

A stream holds its place for its whole length, so the cap must be well above the streams a
process serves at once; the default (4,096) is for a cap that only an overload reaches.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ServiceUnavailable

__all__ = ["CHAT_PATH", "CountInflight", "InflightRequests", "Overloaded"]

CHAT_PATH = "/v1/chat/completions"


class Overloaded(ServiceUnavailable):
    code = "overloaded"


class InflightRequests:
    """How many chat requests this process holds now (``CountInflight`` keeps it)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def admit(self, limit: int) -> None:
        """Raise ``Overloaded`` when more than ``limit`` are held (this request counted)."""
        if self.count > limit:
            raise Overloaded(
                f"this gateway process holds {limit} requests, its limit; retry shortly",
                retry_after=1,
            )


class CountInflight:
    """ASGI middleware: counts the requests to ``path`` while the app handles them (until the
    response's last byte is sent, or the handling fails)."""

    def __init__(self, app: ASGIApp, *, inflight: InflightRequests, path: str = CHAT_PATH) -> None:
        self.app = app
        self._inflight = inflight
        self._path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self._path:
            await self.app(scope, receive, send)
            return
        inflight = self._inflight
        inflight.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            inflight.count -= 1
