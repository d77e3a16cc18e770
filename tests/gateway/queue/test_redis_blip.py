"""Redis failing under queued jobs (a redis-server of the test's own, stopped and restarted
with its append-only file): the edge never answers a job that may still run as if it had
failed for good; what it answers while it cannot settle who owns the job is booked
provisional, and the run that comes later books the calls under the client's answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import gateway.queue.edge.dispatcher as dispatcher_module
from gateway.errors import GatewayError, RunTimedOut, ServiceUnavailable
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import Collect, job, start_node
from tests.support import RedisServer, free_port, until


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path, aof=True)
    server.start()
    yield server
    server.stop()


@pytest.mark.slow
async def test_a_deadline_passing_while_redis_is_down_is_a_provisional_504_and_never_runs(
    own_redis: RedisServer,
    start_sim,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: the edge answered 503 at once (final), and the job, still queued, was taken
    when Redis came back and booked 504: the client's 503 and the row disagreed."""
    monkeypatch.setattr(dispatcher_module, "RUNNING_GRACE_S", 0.5)
    sim = await start_sim(2)
    redis = aioredis.Redis.from_url(own_redis.url, socket_timeout=0.5)
    keys = RedisKeys("blip")
    replies = ReplyRouter(redis, keys.replies("edge1"), block_ms=100)
    replies.start()
    dispatcher = Dispatcher(redis, keys, replies, max_depth=100, claim_ttl_s=60)
    try:
        await redis.config_set("appendfsync", "always")
        stream = await dispatcher.submit(job("r1", "edge1", timeout_s=1.0))
        own_redis.stop()
        with pytest.raises(GatewayError) as raised:
            async for _reply in stream:
                pass
        assert isinstance(raised.value, RunTimedOut)
        assert raised.value.provisional
        own_redis.start()  # its append-only file kept the queued job
        booked = Collect()
        node = await start_node(redis, keys, [sim], booked, "w1")
        try:
            await until(lambda: bool(booked.entries), 10)
        finally:
            await node.aclose()
    finally:
        await replies.aclose()
        await redis.aclose()
    assert [(e.request_id, e.outcome, e.status_code) for e in booked.entries] == [
        ("r1", "timeout", 504)
    ]
    assert sim.served == []  # past its deadline: nothing called


async def test_an_enqueue_redis_never_answered_is_a_provisional_503() -> None:
    redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    keys = RedisKeys("nowhere")
    replies = ReplyRouter(redis, keys.replies("edge1"), block_ms=100)
    dispatcher = Dispatcher(redis, keys, replies, max_depth=100, claim_ttl_s=60)
    try:
        with pytest.raises(ServiceUnavailable) as raised:
            await dispatcher.submit(job("r1", "edge1"))
        assert raised.value.provisional  # it may have been queued: a run may book it
    finally:
        await redis.aclose()
    await asyncio.sleep(0)
