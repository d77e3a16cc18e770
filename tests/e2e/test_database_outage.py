"""The database stopped mid-run (PostgreSQL behind a TCP proxy the test cuts): what needs SQL
answers clear 503s, not 500s, and no hang; chat keeps serving from Redis and its ledger rows land
once the database is back; then everything is served again, no restart."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.accounting.conftest import pg_url
from tests.support import (
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)
from tests.support.ledger import wait_entry

__all__ = ["pg_url"]

pytestmark = pytest.mark.postgres

SMALL = "llama-3.1-8b-instruct"
CHAT = {"model": "small", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
ACME = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"}
FINANCE = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_FINANCE_KEY']}"}
ADMIN = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_ADMIN_KEY']}"}


class TcpProxy:
    """Forwards a local port to PostgreSQL; ``cut`` closes the listener and every connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the blocked accept (close alone does not)
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def own_stack(
    tmp_path: Path, redis_url: str, key_prefix: str, pg_url: str
) -> Iterator[tuple[TcpProxy, str, str]]:
    host, _, rest = pg_url.partition("@")[2].partition(":")
    proxy = TcpProxy((host, int(rest.split("/")[0])))
    proxy.start()
    via_proxy = pg_url.replace(f"@{host}:{rest.split('/')[0]}/", f"@127.0.0.1:{proxy.port}/")
    procs: list[Proc] = []
    try:
        sim_port = free_port()
        sim, _usage = start_sim(SMALL, sim_port, tmp_path)
        procs.append(sim)
        port = free_port()
        config = gateway_config(
            workdir=tmp_path,
            redis_url=redis_url,
            prefix=key_prefix,
            database_url=via_proxy,
            sim_ports={SMALL: sim_port},
            port=port,
            admin_port=free_port(),
        )
        gateway = start_gateway(config, tmp_path)
        procs.append(gateway)
        wait_ready(gateway, f"http://127.0.0.1:{port}/readyz")
        yield proxy, f"http://127.0.0.1:{port}", pg_url
        log = gateway.output()
        assert "unhandled error" not in log, log[-3000:]
    finally:
        for proc in reversed(procs):
            proc.stop()
        proxy.cut()


async def test_database_outage_and_recovery(own_stack: tuple[TcpProxy, str, str]) -> None:
    proxy, base, database_url = own_stack
    needs_sql = [
        ("GET", "/v1/reports/costs", FINANCE),
        ("GET", "/v1/reports/what-if", FINANCE),
        ("GET", "/v1/rules/acme", ADMIN),
    ]
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=ACME)).status_code == 200
        for method, path, headers in needs_sql:
            assert (await http.request(method, path, headers=headers)).status_code == 200, path

        proxy.cut()
        for method, path, headers in needs_sql:
            started = time.perf_counter()
            response = await http.request(method, path, headers=headers)
            elapsed = time.perf_counter() - started
            assert response.status_code == 503, (path, response.text)
            assert response.json()["error"]["code"] == "service_unavailable"
            assert elapsed < 5.0, f"{path}: 503 took {elapsed:.2f}s"
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["database"] != "ok"
        # chat needs no SQL on its path: its ledger event waits in the Redis stream
        during = await http.post("/v1/chat/completions", json=CHAT, headers=ACME)
        assert during.status_code == 200, during.text

        proxy.start()
        deadline = time.monotonic() + 15
        while (await http.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "not ready again after the database came back"
            await asyncio.sleep(0.2)
        for method, path, headers in needs_sql:
            assert (await http.request(method, path, headers=headers)).status_code == 200, path

    entry = await wait_entry(database_url, during.headers["x-request-id"], timeout_s=30)
    assert entry.outcome == "ok" and entry.tenant == "acme"
