"""Slow clients against a real ``tiergate serve``: a trickled head or a body sent a byte at a
time gets 408 ``request_timeout`` on the public and the admin port alike, within the configured
read timeouts, and the gateway logs no error for it."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.gateway.test_read_timeouts import trickle, trickle_on
from tests.support import (
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    new_prefix,
    start_gateway,
    start_sim,
    wait_ready,
)

TIMEOUT_S = 1.0
SMALL = "llama-3.1-8b-instruct"


@dataclass
class Gateway:
    proc: Proc
    ports: dict[str, int]
    ledger: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("slow")
    sim_port = free_port()
    sim, _usage = start_sim(SMALL, sim_port, workdir)
    prefix = new_prefix()
    ports = {"public": free_port(), "admin": free_port()}
    config = gateway_config(
        workdir=workdir, redis_url=redis_url, prefix=prefix,
        database_url=f"sqlite+aiosqlite:///{workdir / 'ledger.db'}",
        sim_ports={SMALL: sim_port}, port=ports["public"], admin_port=ports["admin"],
        server={"host": "127.0.0.1", "port": ports["public"], "admin_port": ports["admin"],
                "head_timeout_s": TIMEOUT_S, "body_timeout_s": TIMEOUT_S},
    )  # fmt: skip
    proc = start_gateway(config, workdir)
    try:
        wait_ready(proc, f"http://127.0.0.1:{ports['public']}/readyz")
        yield Gateway(proc, ports, workdir / "ledger.db")
    finally:
        proc.stop()
        sim.stop()
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()


@pytest.mark.parametrize("port_name", ["public", "admin"])
def test_a_trickled_head_gets_408_on_both_ports(gateway: Gateway, port_name: str) -> None:
    started = time.monotonic()
    head = b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    answer = trickle(gateway.ports[port_name], head, every_s=0.05, upto_s=25)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b'"request_timeout"' in answer
    assert time.monotonic() - started < TIMEOUT_S + 2


@pytest.mark.parametrize(
    ("port_name", "path"),
    [("public", b"/v1/chat/completions"), ("admin", b"/v1/admin/tenants")],
)
def test_a_one_byte_a_tick_body_gets_408_on_both_ports(
    gateway: Gateway, port_name: str, path: bytes
) -> None:
    var = "TIERGATE_KEY_ACME" if port_name == "public" else "TIERGATE_ADMIN_KEY"
    key = TEST_KEYS[var].encode()
    head = (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key
        + b"\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", gateway.ports[port_name]), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        answer = trickle_on(sock, b" " * 400, every_s=0.1, upto_s=25)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.monotonic() - started < TIMEOUT_S + 2


def test_the_gateway_logged_no_error_and_still_serves(gateway: Gateway) -> None:
    with socket.create_connection(("127.0.0.1", gateway.ports["public"]), timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    # the chat request cut off mid-body was authenticated: booked, as a client gone (499)
    with contextlib.closing(sqlite3.connect(gateway.ledger)) as db:
        rows = db.execute("SELECT tenant, outcome, status_code FROM ledger_entries").fetchall()
    assert rows == [("acme", "client_disconnected", 499)]
    log = gateway.proc.output()
    assert "Exception in ASGI application" not in log, log
    assert '"level": "ERROR"' not in log and "ERROR" not in log, log
