"""A connection whose transport is closed under it (a Redis node killed between the connect
and the first command) fails as ``ConnectionError``, which every caller handles, not as uvloop's
``RuntimeError``, which none does (a Redis Cluster node killed under load showed it)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.queue.client.connection import redis_client


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
