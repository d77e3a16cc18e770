"""The Redis client: its pool waits for a free connection instead of failing a burst; a
command starts no task; a send to a Redis that stopped reading times out."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.queue.client.connection import redis_client
from tests.support import RedisServer


async def test_a_burst_beyond_the_pool_waits_for_connections(
    redis_url: str, key_prefix: str
) -> None:
    # What is tested is the pool (waiting, not failing, when all its connections are out), not
    # the timeout: a generous one, since the shared server and this process share two loaded
    # cores with the suite's other worker (a 2 s one expired once in a full run).
    client = redis_client(redis_url, socket_timeout=10.0, max_connections=3)
    try:
        key = f"{key_prefix}:empty"
        # Twelve blocking commands on three connections: each holds one for 0.1 s.
        results = await asyncio.gather(
            *(client.execute_command("BLPOP", key, 0.1) for _ in range(12)),
            return_exceptions=True,
        )
    finally:
        await client.aclose()
    assert results == [None] * 12


async def test_a_command_starts_no_task(redis_url: str, key_prefix: str) -> None:
    # redis-py sends under asyncio.wait_for, which on Python 3.11 runs every send as a new task.
    client = redis_client(redis_url, socket_timeout=1.0)
    loop = asyncio.get_running_loop()
    created: list[object] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    try:
        await client.set(f"{key_prefix}:k", b"v")  # connected
        loop.set_task_factory(counting)
        assert await client.get(f"{key_prefix}:k") == b"v"
    finally:
        loop.set_task_factory(factory)
        await client.aclose()
    assert created == []


async def test_a_send_to_a_stalled_redis_times_out_and_drops_the_connection(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    client = redis_client(server.url, socket_timeout=0.5)
    try:
        await client.ping()
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # reads nothing more: the socket fills up
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await client.set("big", b"x" * (64 << 20))
        assert time.monotonic() - started < 5
        os.kill(server.proc.pid, signal.SIGCONT)
        assert await client.ping()  # a fresh connection; the half-sent one was dropped
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        await client.aclose()
        server.stop()
