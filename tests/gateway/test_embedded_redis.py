"""The embedded Redis keeps what it holds across a restart: AOF (``appendfsync everysec``) in a
data directory of its own that outlives the process (``redis.embedded_dir``), so ledger events
waiting for SQL, queued jobs and claims survive a gateway restart or a crash of the server.
Real ``redis-server`` processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.embedded_redis import EmbeddedRedis, EmbeddedRedisError
from gateway.tasks import stop_task


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


def test_it_runs_with_aof_every_second(tmp_path: Path) -> None:
    server = EmbeddedRedis(data_dir=tmp_path / "redis")
    client = _client(server.start())
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert Path(client.config_get("dir")["dir"]) == (tmp_path / "redis").resolve()
    finally:
        client.close()
        server.stop()


def test_a_stream_entry_survives_a_stop_and_a_new_server_on_the_same_directory(
    tmp_path: Path,
) -> None:
    first = EmbeddedRedis(data_dir=tmp_path / "redis")
    client = _client(first.start())
    entry = client.xadd("tg:ledger", {"request_id": "req_1", "cost": "42"})
    client.close()
    first.stop()

    second = EmbeddedRedis(data_dir=tmp_path / "redis")
    client = _client(second.start())
    try:
        assert client.xrange("tg:ledger") == [(entry, {b"request_id": b"req_1", b"cost": b"42"})]
    finally:
        client.close()
        second.stop()


def test_a_killed_server_is_restarted_on_its_port_with_what_it_held(tmp_path: Path) -> None:
    server = EmbeddedRedis(data_dir=tmp_path / "redis")
    url = server.start()
    client = _client(url)
    try:
        entry = client.xadd("tg:ledger", {"request_id": "req_2"})
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)  # a crash: no shutdown, no final rewrite
        restarted = False
        for _ in range(200):  # until the kill has landed
            if restarted := server.ensure_running():
                break
            time.sleep(0.01)
        assert restarted  # on the same URL
        assert server.url == url
        assert client.xrange("tg:ledger") == [(entry, {b"request_id": b"req_2"})]
        assert server.ensure_running() is False  # running: nothing to do
    finally:
        client.close()
        server.stop()


def test_two_servers_never_share_a_directory(tmp_path: Path) -> None:
    first = EmbeddedRedis(data_dir=tmp_path / "redis")
    first.start()
    try:
        with pytest.raises(EmbeddedRedisError, match="embedded_dir"):
            EmbeddedRedis(data_dir=tmp_path / "redis").start()
    finally:
        first.stop()
    again = EmbeddedRedis(data_dir=tmp_path / "redis")  # released on stop
    again.start()
    again.stop()


async def test_the_supervisor_brings_a_crashed_server_back(tmp_path: Path) -> None:
    server = EmbeddedRedis(data_dir=tmp_path / "redis")
    client = aioredis.Redis.from_url(server.start(), socket_timeout=1)
    supervisor = asyncio.create_task(server.supervise(every_s=0.1))
    try:
        await client.set("tg:k", "v")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        for _ in range(100):
            with contextlib.suppress(RedisError):
                if await client.get("tg:k") == b"v":
                    break
            await asyncio.sleep(0.1)
        assert await client.get("tg:k") == b"v"
    finally:
        await stop_task(supervisor)
        await client.aclose()
        server.stop()
