"""A response's head leaves with its first body bytes, in one write; nothing is held longer
than the loop turn; interim 100 Continue and closing are not delayed."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest
from starlette.types import Receive, Scope, Send

from gateway.api.head_with_body import HeadWithFirstBody
from gateway.server import _uvicorn_config
from tests.support import free_port, uvicorn_in_thread


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_head_and_first_body_are_one_write() -> None:
    raw = Recording()
    transport = HeadWithFirstBody(raw, asyncio.get_running_loop())
    transport.write(HEAD)
    assert raw.writes == []  # held for the body
    transport.write(b"ok")
    transport.write(b"more")
    assert raw.writes == [HEAD + b"ok", b"more"]
    await asyncio.sleep(0)
    assert raw.writes == [HEAD + b"ok", b"more"]  # nothing sent twice


async def test_a_head_without_a_body_in_the_same_turn_goes_alone() -> None:
    raw = Recording()
    transport = HeadWithFirstBody(raw, asyncio.get_running_loop())
    transport.write(HEAD)
    await asyncio.sleep(0)  # the end of the loop turn
    assert raw.writes == [HEAD]
    transport.write(b"ok")
    assert raw.writes == [HEAD, b"ok"]


async def test_interim_continue_is_not_held_and_close_flushes() -> None:
    raw = Recording()
    transport = HeadWithFirstBody(raw, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(HEAD)
    transport.close()
    assert raw.writes[-1] == HEAD and raw.closed


# The same through a real uvicorn server built as tiergate serve builds it.


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            kind = (await receive())["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"data: 2\n\n"})
        return
    answer = json.dumps({"got": len(body)}).encode()
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    port = free_port()
    with uvicorn_in_thread(_uvicorn_config(_app, "127.0.0.1", port)):
        yield port


def _exchange(port: int, request: bytes, *, until: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while until not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_json_stream_and_continue_through_uvicorn(server: int) -> None:
    answer = _exchange(
        server, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", until=b"}"
    )
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"got": 3}')
    stream = _exchange(server, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", until=b"0\r\n\r\n")
    assert b"data: 1" in stream and b"data: 2" in stream and stream.endswith(b"0\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"abc")
        data = b""
        while b"}" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b'{"got": 3}')
