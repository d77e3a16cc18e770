"""Slow clients: a request's head must arrive within ``server.head_timeout_s`` and its body
within ``server.body_timeout_s`` after it, else 408 ``request_timeout`` and a closed connection
(a connection that sends nothing is just closed). A real uvicorn server built the way
``tiergate serve`` builds both of its own, raw sockets that trickle."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from gateway.server import _uvicorn_config
from gateway.settings import ServerSettings
from tests.support import free_port, uvicorn_in_thread

HEAD_S = 1.0
BODY_S = 1.5
IDLE_S = 3


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, answers its size."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    config = _uvicorn_config(
        _echo,
        "127.0.0.1",
        port,
        head_timeout_s=HEAD_S,
        body_timeout_s=BODY_S,
        keep_alive_s=IDLE_S,
    )
    with uvicorn_in_thread(config):
        yield port


def trickle(port: int, head: bytes, body: bytes = b"", *, every_s: float, upto_s: float) -> bytes:
    """Send ``head`` (then ``body``) a byte every ``every_s``, for at most ``upto_s``; return
    everything the server sent until it closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=upto_s + 5) as sock:
        return trickle_on(sock, head + body, every_s=every_s, upto_s=upto_s)


def trickle_on(sock: socket.socket, data: bytes, *, every_s: float, upto_s: float) -> bytes:
    ended = time.monotonic() + upto_s
    sock.setblocking(False)
    got = b""
    for byte in data:
        if time.monotonic() > ended:
            break
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(every_s)
        try:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
        except BlockingIOError:
            pass
        except ConnectionResetError:
            return got
    sock.setblocking(True)
    sock.settimeout(max(ended - time.monotonic(), 0.1) + 3)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _code(answer: bytes) -> str:
    code: str = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"]
    return code


def test_the_defaults_are_bounded() -> None:
    defaults = ServerSettings()
    assert 0 < defaults.head_timeout_s <= 30
    assert 0 < defaults.body_timeout_s <= 60


def test_a_trickled_head_gets_408_at_the_head_timeout(port: int) -> None:
    started = time.monotonic()
    head = b"POST / HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    answer = trickle(port, head, every_s=0.05, upto_s=20)
    took = time.monotonic() - started
    assert _status(answer) == 408, answer
    assert _code(answer) == "request_timeout"
    assert HEAD_S - 0.1 <= took < HEAD_S + 1.5, took


def test_a_connection_that_sends_nothing_is_idle_and_closed_after_keep_alive(port: int) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert sock.recv(65536) == b""  # no answer: there was no request
    assert IDLE_S - 0.1 <= time.monotonic() - started < IDLE_S + 1.5


def test_a_head_begun_after_an_idle_wait_is_bounded_from_its_first_byte(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        time.sleep(HEAD_S + 0.5)  # idle, not yet a request
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(sock.recv(65536)) == 200


def test_a_one_byte_a_tick_body_gets_408_at_the_body_timeout(port: int) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)  # the head at once
        started = time.monotonic()
        answer = trickle_on(sock, b"x" * 200, every_s=0.1, upto_s=20)
    took = time.monotonic() - started
    assert _status(answer) == 408, answer
    assert _code(answer) == "request_timeout"
    assert BODY_S - 0.1 <= took < BODY_S + 1.5, took


def test_a_chunked_trickle_gets_408_too(port: int) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        answer = trickle_on(sock, b"1\r\nx\r\n" * 100 + b"0\r\n\r\n", every_s=0.1, upto_s=20)
    assert _status(answer) == 408, answer


def test_a_body_in_pieces_within_the_timeout_is_served_and_the_next_request_is_bounded_too(
    port: int,
) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nab")
        time.sleep(0.5)
        sock.sendall(b"cd")
        time.sleep(0.5)
        sock.sendall(b"ef")
        answer = sock.recv(65536)
        assert _status(answer) == 200 and answer.endswith(b"\r\n\r\n6"), answer
        time.sleep(HEAD_S + 0.5)  # idle between requests: keep-alive's business, not the head's
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(sock.recv(65536)) == 200
        # the next request's head trickles: bounded from its first byte
        started = time.monotonic()
        answer = trickle_on(sock, b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 50,
                            every_s=0.05, upto_s=20)  # fmt: skip
    assert _status(answer) == 408, answer
    assert time.monotonic() - started < HEAD_S + 1.5
