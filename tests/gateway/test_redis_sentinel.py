"""``redis.mode: sentinel``: the client finds the master through Sentinel, and after a failover
(``SENTINEL FAILOVER``) finds the new one; a master of the test's own, its replica and one
Sentinel (``redis-server --sentinel``), all stopped at the end. Slow (a failover takes seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.queue.client.connection import configured_client
from gateway.settings import RedisSettings
from tests.support import free_port

MASTER = "tgmaster"


def _server(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def _wait(port: int, check: str = "PING") -> None:
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                client.execute_command(check)
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"nothing answers on {port}")
    finally:
        client.close()


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[tuple[int, int, int]]:
    master, replica, sentinel = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        base = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        procs.append(_server([*base, "--port", str(master)], tmp_path / "master.log"))
        _wait(master)
        procs.append(
            _server(
                [*base, "--port", str(replica), "--replicaof", "127.0.0.1", str(master)],
                tmp_path / "replica.log",
            )
        )
        _wait(replica)
        conf = tmp_path / "sentinel.conf"
        conf.write_text(
            f"port {sentinel}\nbind 127.0.0.1\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {master} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            f"sentinel failover-timeout {MASTER} 5000\n"
        )
        procs.append(_server(["redis-server", str(conf), "--sentinel"], tmp_path / "s.log"))
        _wait(sentinel)
        yield master, replica, sentinel
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_the_client_follows_the_master_through_a_failover(
    sentinel: tuple[int, int, int],
) -> None:
    master, replica, sentinel_port = sentinel
    settings = RedisSettings(
        url="redis://127.0.0.1/0",
        mode="sentinel",
        sentinels=[f"127.0.0.1:{sentinel_port}"],
        sentinel_master=MASTER,
    )
    client = configured_client(settings, socket_timeout=2.0)
    try:
        await client.set("tgsentinel:k", "1")
        assert await client.get("tgsentinel:k") == b"1"
        probe = redis.Redis(port=master)
        assert probe.get("tgsentinel:k") == b"1"  # written on the master it named
        probe.close()

        watcher = redis.Redis(port=sentinel_port)
        # The replica must have caught up before Sentinel promotes it.
        deadline = time.monotonic() + 20
        while True:
            try:
                watcher.execute_command("SENTINEL", "FAILOVER", MASTER)
                break
            except redis.ResponseError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        while watcher.sentinel_get_master_addr_by_name(MASTER)[1] != replica:
            assert time.monotonic() < deadline + 20
            await asyncio.sleep(0.1)
        watcher.close()

        # A write may still reach the old master until it is turned into a replica (and be
        # lost with its data, as Sentinel documents); the client soon writes to the new one.
        probe = redis.Redis(port=replica)
        deadline = time.monotonic() + 20
        while probe.get("tgsentinel:k") != b"2":
            assert time.monotonic() < deadline
            with contextlib.suppress(redis.ConnectionError, redis.ReadOnlyError):
                await client.set("tgsentinel:k", "2")
            await asyncio.sleep(0.2)
        probe.close()
        assert await client.get("tgsentinel:k") == b"2"
    finally:
        await client.aclose()
