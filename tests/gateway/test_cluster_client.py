"""The Redis Cluster client against a cluster of the test's own (three masters, three replicas):
a dead node must not take down commands whose keys live on the others, and the cancel channel
(pub/sub) works.

redis-py asks its *default node* (the first master it found) for the keys of a command it cannot
parse alone (``COMMAND GETKEYS``: ``XREAD``, ``XREADGROUP``), and an error from that question
never made the client read the cluster's slots again. With that node killed, every ``XREAD`` and
``XREADGROUP`` failed for good, whichever node held the stream: the edge's reply reader and the
ledger sink stayed down after the failover (the killed-master probe in
``tests/e2e/test_redis_cluster.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.cluster import key_slot

from gateway.queue.client.connection import redis_client
from gateway.queue.client.streams import stream_entries
from gateway.queue.ownership.cancels import CancelListener
from tests.redis_cluster import LocalRedisCluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalRedisCluster]:
    local = LocalRedisCluster(tmp_path)
    try:
        local.start()
        yield local
    finally:
        local.stop()


def _key_off(client: aioredis.Redis, port: int, stem: str, *, on: bool = False) -> str:
    """A key (``{<stem>:<n>}:s``) whose slot a master other than ``port`` serves (``on``: that
    ``port`` serves)."""
    manager = client.nodes_manager  # type: ignore[attr-defined]
    for n in range(1000):
        key = f"{{{stem}:{n}}}:s"
        if (manager.slots_cache[key_slot(key.encode())][0].port == port) == on:
            return key
    raise AssertionError("no such key")


async def _default_node_killed(cluster: LocalRedisCluster) -> tuple[aioredis.Redis, int]:
    client = redis_client(cluster.url, mode="cluster", socket_timeout=2.0)
    await client.ping()
    default = client.get_default_node().port  # type: ignore[attr-defined]
    return client, default


async def test_stream_reads_go_on_when_the_default_node_dies(cluster: LocalRedisCluster) -> None:
    client, default = await _default_node_killed(cluster)
    try:
        replies, ledger = _key_off(client, default, "e"), _key_off(client, default, "ledger")
        await client.xadd(replies, {"r": "1"})
        await client.xgroup_create(ledger, "sink", id="0", mkstream=True)
        await client.xadd(ledger, {"l": "1"})
        cluster.kill(default)
        for since in (">", "0", "0"):  # the first and every later read: none asks the dead node
            read = await client.xread({replies: "0-0"}, count=10, block=100)
            assert [fields for _id, fields in stream_entries(read)] == [{b"r": b"1"}]
            group = await client.xreadgroup("sink", "c", {ledger: since}, count=10, block=100)
            assert [fields for _id, fields in stream_entries(group)] == [{b"l": b"1"}]
    finally:
        await client.aclose()


async def test_keys_asked_of_a_dead_default_node_refresh_the_slots(
    cluster: LocalRedisCluster,
) -> None:
    """A command whose keys only the server can tell (``ZUNIONSTORE``'s ``numkeys``) asks the
    default node: once it is dead, the client reads the slots again, and after the failover
    asks the new master (before, it asked the dead node for ever)."""
    client, default = await _default_node_killed(cluster)
    try:
        key = _key_off(client, default, "z")
        source = key.replace(":s", ":t")
        await client.zadd(source, {"m": 1})
        cluster.kill(default)
        with pytest.raises(aioredis.ConnectionError):
            await client.zunionstore(key, [source])  # the cluster has not noticed yet
        cluster.wait_replaced(default, _key_off(client, default, "d", on=True))
        results = []
        for _ in range(3):
            try:
                results.append(await client.zunionstore(key, [source]))
            except aioredis.ConnectionError:
                results.append(None)
        assert results[-2:] == [1, 1], results
        assert client.get_default_node().port != default  # type: ignore[attr-defined]
    finally:
        await client.aclose()


async def _heard(
    cluster: LocalRedisCluster, channel: str, listener: aioredis.Redis, heard: list[str]
) -> bool:
    """Publish a cancel through a client of its own until ``listener``'s side hears one (5 s)."""
    publisher = redis_client(cluster.url, mode="cluster")
    try:
        for n in range(50):
            await publisher.publish(channel, f"r{n}")
            await asyncio.sleep(0.1)
            if heard:
                return True
        return False
    finally:
        await publisher.aclose()


async def test_cancels_are_heard_on_a_cluster_and_after_their_node_died(
    cluster: LocalRedisCluster,
) -> None:
    """The cancel channel (``keys.cancels``) on a cluster: a worker listens on its blocking
    client, which has run no command yet when the listener subscribes (before, redis-py's
    pub/sub looked the channel's slot up in an empty slot map: ``KeyError``, and the listener
    died at the worker's start: no cancel was ever heard); a cluster carries a ``PUBLISH`` to
    every node. When the node it listens on dies, it subscribes again on a live one."""
    listener = redis_client(cluster.url, mode="cluster", socket_timeout=5.0)
    heard: list[str] = []
    hearing = CancelListener(listener, "tg:cancels", heard.append)
    hearing.start()
    try:
        assert await _heard(cluster, "tg:cancels", listener, heard)
        port = cluster.master_of("tg:cancels")
        cluster.kill(port)
        await asyncio.to_thread(cluster.wait_replaced, port, "tg:cancels")
        heard.clear()
        assert await _heard(cluster, "tg:cancels", listener, heard)
    finally:
        await asyncio.wait_for(hearing.aclose(), 10)
        await listener.aclose()


async def test_a_pipeline_reads_several_keys_of_one_slot(cluster: LocalRedisCluster) -> None:
    """The queue snapshot reads a tier's lane depths with one ``MGET`` in a pipeline (one hash
    tag, one slot). redis-py's cluster pipeline refuses ``mget`` whatever the slots
    (``RedisClusterException``, not a Redis error): the edge's snapshot loop died at its first
    refresh, and expected waits, deadline admission and spill-over never saw the queue."""
    client = redis_client(cluster.url, mode="cluster")
    try:
        await client.set("{q:small}:depth:a", 3)
        async with client.pipeline(transaction=False) as pipe:
            pipe.mget(["{q:small}:depth:a", "{q:small}:depth:b"])
            pipe.get("{q:small}:depth:a")
            assert await pipe.execute() == [[b"3", None], b"3"]
    finally:
        await client.aclose()
