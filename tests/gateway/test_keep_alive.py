"""Idle client connections stay open ``server.keep_alive_s`` (longer than a load balancer's idle
timeout, so that the balancer closes them, never the gateway under its feet): a real uvicorn
server built the way ``tiergate serve`` builds its own."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.types import Receive, Scope, Send

from gateway.server import _uvicorn_config
from gateway.settings import ServerSettings
from tests.support import free_port, uvicorn_in_thread

_REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def _server(keep_alive_s: int) -> Iterator[int]:
    port = free_port()
    with uvicorn_in_thread(_uvicorn_config(_app, "127.0.0.1", port, keep_alive_s=keep_alive_s)):
        yield port


def _answered(sock: socket.socket) -> bool:
    sock.sendall(_REQUEST)
    return sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_the_default_outlasts_a_load_balancers_idle_timeout() -> None:
    assert ServerSettings().keep_alive_s > 60


def test_an_idle_connection_is_kept_for_keep_alive_s_then_closed() -> None:
    with _server(keep_alive_s=2) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        assert _answered(sock)
        time.sleep(1.0)  # idle, within keep_alive_s: still open
        assert _answered(sock)
        time.sleep(3.0)  # idle past it: the server has closed it
        assert sock.recv(65536) == b""
