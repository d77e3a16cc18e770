"""The edge's reply reader against a real Redis: delivery to waiters, how often it trims, and
a blip of its connection."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import redis.asyncio as aioredis

from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.jobs import Reply
from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import Collect, job, start_node
from tests.support import until

_ENTRIES = 300
"""Enough entries for an approximate trim to drop whole stream nodes (100 entries each)."""


async def _deliver_all(router: ReplyRouter, redis: aioredis.Redis, key: str) -> None:
    """Send ``_ENTRIES`` replies for one waiter and wait until the reader has handed them over."""
    queue = router.register("r1")
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(_ENTRIES):
            pipe.xadd(key, Reply("r1", "chunk", {"n": n}).fields())
        await pipe.execute()
    got = [await asyncio.wait_for(queue.get(), 5) for _ in range(_ENTRIES)]
    assert [r.data["n"] for r in got if isinstance(r, Reply)] == list(range(_ENTRIES))


async def test_what_was_read_is_trimmed_once_the_period_is_up(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    key = RedisKeys(key_prefix).replies("trims")
    router = ReplyRouter(redis_conn, key, block_ms=100, trim_every_s=0.0)
    router.start()
    try:
        await _deliver_all(router, redis_conn, key)
        for _ in range(50):
            if await redis_conn.xlen(key) < _ENTRIES:
                break
            await asyncio.sleep(0.05)
        assert await redis_conn.xlen(key) < _ENTRIES
    finally:
        await router.aclose()


async def test_no_trim_on_every_read(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    key = RedisKeys(key_prefix).replies("keeps")
    router = ReplyRouter(redis_conn, key, block_ms=100, trim_every_s=3600.0)
    router.start()
    try:
        await _deliver_all(router, redis_conn, key)
        await asyncio.sleep(0.3)  # a few more reads go by
        assert await redis_conn.xlen(key) == _ENTRIES
    finally:
        await router.aclose()


async def test_a_blip_of_the_reply_reader_does_not_answer_a_running_job_503(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    """The reader's connection is cut while a worker runs the job. Before, every waiter was
    answered 503 at once while its job ran on and was booked 200; now the reader reads again
    and the client gets the answer its row books."""
    sim = await start_sim(2, itl_s=0.1)  # 8 tokens: about 0.8 s
    keys = RedisKeys(key_prefix)
    reader = aioredis.Redis.from_url(redis_url, client_name=f"{key_prefix}-reader")
    replies = ReplyRouter(reader, keys.replies("edge1"), block_ms=200)
    replies.start()
    dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=100, claim_ttl_s=60)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1")
    try:
        stream = await dispatcher.submit(job("r1", "edge1"))
        await until(lambda: sim.now == 1, 5)  # the worker is calling the replica
        clients: Any = await redis_conn.client_list()
        ids = [c["id"] for c in clients if c.get("name") == f"{key_prefix}-reader"]
        assert ids
        for client_id in ids:
            await redis_conn.client_kill_filter(_id=client_id)
        final = [r async for r in stream][-1]
    finally:
        await node.aclose()
        await replies.aclose()
        await reader.aclose()
    assert final.kind == "result"
    assert [(e.request_id, e.status_code) for e in booked.entries] == [("r1", 200)]


async def test_a_stream_whose_chunks_could_not_be_sent_ends_with_an_error_and_is_booked_so(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    """The reply stream refuses writes for a moment mid-stream (Redis answers an error to
    every ``XADD``): the chunks sent then are lost. Before, the later chunks and a clean end
    went out — an answer with a hole, booked ok; now the client gets a prefix and an error
    event, and the row says ``stream_error``, with every token the backend served."""
    sim = await start_sim(2, itl_s=0.15)  # 8 tokens: about 1.2 s
    keys = RedisKeys(key_prefix)
    stream_key = keys.replies("edge1")
    replies = ReplyRouter(redis_conn, stream_key, block_ms=100)
    replies.start()
    dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=100, claim_ttl_s=60)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1")
    got: list[Reply] = []
    try:
        stream = await dispatcher.submit(dataclasses.replace(job("r1", "edge1"), stream=True))
        got.append(await anext(stream))  # the first chunk went out
        await redis_conn.delete(stream_key)
        await redis_conn.set(stream_key, "not a stream")  # every XADD fails (WRONGTYPE)
        await asyncio.sleep(0.6)
        await redis_conn.delete(stream_key)
        got += [r async for r in stream]
    finally:
        await node.aclose()
        await replies.aclose()
    assert got[-1].kind == "error"
    assert all(r.kind == "chunk" for r in got[:-1])
    assert [(e.outcome, e.status_code) for e in booked.entries] == [("stream_error", 200)]
    assert booked.entries[0].completion_tokens == 8


async def test_a_stream_whose_first_chunk_could_not_be_sent_is_a_502_and_booked_so(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    """No chunk reached the edge: its client gets an HTTP error, not a stream, so its row is a
    502 (it was booked ``stream_error``, status 200, which no client saw)."""
    sim = await start_sim(2, itl_s=0.15)
    keys = RedisKeys(key_prefix)
    stream_key = keys.replies("edge1")
    replies = ReplyRouter(redis_conn, stream_key, block_ms=100)
    replies.start()
    dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=100, claim_ttl_s=60)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1")
    try:
        await redis_conn.set(stream_key, "not a stream")  # every XADD fails (WRONGTYPE)
        stream = await dispatcher.submit(dataclasses.replace(job("r1", "edge1"), stream=True))
        await until(lambda: sim.now == 1, 5)
        await asyncio.sleep(0.6)
        await redis_conn.delete(stream_key)
        got = [r async for r in stream]
    finally:
        await node.aclose()
        await replies.aclose()
    assert [r.kind for r in got] == ["error"]
    assert got[0].meta.status == 502
    assert [(e.outcome, e.status_code) for e in booked.entries] == [("upstream_error", 502)]
