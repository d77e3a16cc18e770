"""A connection whose transport is closed under it (a Redis node killed between the connect
and the first command) fails as ``ConnectionError``, which every caller handles, not as uvloop's
``RuntimeError``, which none does (a Redis Cluster node killed under load showed it). The
blocking reads' client waits out its block and then a command's bound, no longer: a server that
stops answering without closing its connections holds a read that long, not 5 s."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.queue.client.connection import BLOCKING_READ_S, blocking_client, redis_client
from gateway.settings import RedisSettings


async def _closed_under(url: str) -> BaseException | None:
    client = redis_client(url)
    try:
        await client.ping()
        pool = client.connection_pool
        connection = await pool.get_connection()
        try:
            connection._writer.transport.close()  # type: ignore[union-attr]  # the peer vanished
            await asyncio.sleep(0)
            try:
                await connection.send_command("PING")
            except BaseException as exc:  # noqa: BLE001 - what it raises is the point
                return exc
            return None
        finally:
            await pool.release(connection)
    finally:
        await client.aclose()


def test_a_send_on_a_closed_transport_is_a_connection_error(redis_url: str) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        raised = runner.run(_closed_under(redis_url))
    assert isinstance(raised, RedisConnectionError), repr(raised)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:7000/0", "rediss://127.0.0.1:7000/0"])
def test_cluster_nodes_connect_with_the_same_connection_class(url: str) -> None:
    client = redis_client(url, mode="cluster")
    cluster = client.nodes_manager  # type: ignore[attr-defined]
    classes = {cluster.connection_kwargs["connection_class"]}
    classes |= {node.connection_class for node in cluster.startup_nodes.values()}
    standalone = redis_client(url).connection_pool.connection_class
    assert classes == {standalone}, classes


async def _read_from_a_silent_server() -> tuple[BaseException | None, float]:
    """A blocking read from a server that accepts and reads, and never answers (a host gone
    under its connections); what it raised and when."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            pass
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = blocking_client(RedisSettings(url=f"redis://127.0.0.1:{port}/0"))
    started = time.monotonic()
    try:
        await client.xread({"stream": "$"}, block=round(BLOCKING_READ_S * 1000))
    except BaseException as exc:  # noqa: BLE001 - what it raises is the point
        return exc, time.monotonic() - started
    finally:
        await client.aclose()
        server.close()
    return None, time.monotonic() - started


def test_a_blocking_read_on_a_server_that_stopped_answering_fails_soon() -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        raised, took = runner.run(_read_from_a_silent_server())
    assert isinstance(raised, RedisTimeoutError), repr(raised)
    bound = RedisSettings().command_timeout_s
    assert BLOCKING_READ_S <= took < BLOCKING_READ_S + bound + 1.0, took  # it was 5 s


async def _empty_blocks(url: str, reads: int) -> list[object]:
    client = blocking_client(RedisSettings(url=url))
    try:
        block_ms = round(BLOCKING_READ_S * 1000)
        return [
            await client.xread({"tiergate-test-empty": "$"}, block=block_ms) for _ in range(reads)
        ]
    finally:
        await client.aclose()


def test_a_blocking_read_that_finds_nothing_ends_empty_not_timed_out(redis_url: str) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        got = runner.run(_empty_blocks(redis_url, 2))
    assert got == [[], []], got
