"""EventStreamResponse as an ASGI app: headers and first event before anything else (the
disconnect listener included), the rest in order, and a client leaving stops the rest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.sse import EventStreamResponse

SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "method": "GET",
    "path": "/",
    "headers": [],
}


async def test_headers_and_first_event_leave_before_the_rest_and_before_listening() -> None:
    log: list[Any] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        log.append("receive")
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        log.append((message["type"], message.get("body"), message.get("more_body")))

    async def rest() -> AsyncIterator[bytes]:
        yield b"data: 2\n\n"
        yield b"data: [DONE]\n\n"

    response = EventStreamResponse(b"data: 1\n\n", rest(), headers={"x-tiergate-tier": "small"})
    await response(SCOPE, receive, send)
    start = log[0]
    assert start[0] == "http.response.start"
    assert log[1] == ("http.response.body", b"data: 1\n\n", True)
    assert log.index("receive") > 1
    bodies = [entry for entry in log if entry != "receive"][1:]
    assert bodies == [
        ("http.response.body", b"data: 1\n\n", True),
        ("http.response.body", b"data: 2\n\n", True),
        ("http.response.body", b"data: [DONE]\n\n", True),
        ("http.response.body", b"", False),
    ]


async def test_a_client_leaving_stops_the_rest() -> None:
    stopped = asyncio.Event()
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    async def rest() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: more\n\n"
                await asyncio.sleep(0.01)
        finally:
            stopped.set()

    response = EventStreamResponse(b"data: 1\n\n", rest(), headers={})
    await asyncio.wait_for(response(SCOPE, receive, send), timeout=5)
    await asyncio.wait_for(stopped.wait(), timeout=5)
    assert sent[0] == b"data: 1\n\n"
    assert b"" not in sent  # never ended cleanly: the client had left
