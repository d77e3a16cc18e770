"""A worker that drains at shutdown keeps what it runs: its heartbeat and its entries' renewals
go on until its last job ends, so no other worker takes a job over (and runs it a second time,
for a second bill) while the draining one is still running it."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import Collect, Edge, job, start_node
from tests.support import until


async def test_a_draining_workers_running_job_is_not_taken_over(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    # 8 tokens: ~8 s, well past the others' reclaim time; slots to spare for a take-over
    sim = await start_sim(4, itl_s=1.0)
    keys = RedisKeys(key_prefix)
    booked = Collect()
    fast = {"reclaim_idle_s": 1.0, "heartbeat_s": 0.2}
    draining = await start_node(redis_conn, keys, [sim], booked, "draining", **fast)
    answer = asyncio.create_task(edge.call(job("r1", edge.edge_id, timeout_s=30)))
    await until(lambda: sim.now == 1, 10)  # the draining worker is calling the replica
    closing = asyncio.create_task(draining.aclose(drain_s=10))
    other = await start_node(redis_conn, keys, [sim], booked, "other", **fast)
    try:
        reply, _wait = await asyncio.wait_for(answer, 20)
        await asyncio.wait_for(closing, 15)
    finally:
        await other.aclose()
    assert reply.kind == "result"
    assert len(sim.served) == 1, sim.served  # run once
    assert [e.request_id for e in booked.entries] == ["r1"]
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:draining"


async def test_a_client_that_leaves_during_the_drain_still_stops_its_job(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    sim = await start_sim(2, itl_s=0.05)  # 200 tokens: ~10 s unless stopped
    keys = RedisKeys(key_prefix)
    booked = Collect()
    draining = await start_node(redis_conn, keys, [sim], booked, "draining")
    running = job("r1", edge.edge_id, max_tokens=200)
    replies = await edge.dispatcher.submit(running)
    await until(lambda: sim.now == 1, 10)  # the worker is calling the backend
    closing = asyncio.create_task(draining.aclose(drain_s=30))
    await asyncio.sleep(0.2)  # the drain has begun: it takes nothing new
    assert not await edge.dispatcher.abandon(running)  # a worker owns it: told to stop
    try:
        await until(lambda: bool(booked.entries), 5)
        await until(lambda: sim.now == 0, 5)  # the backend call was aborted
        await asyncio.wait_for(closing, 5)  # nothing left to drain
    finally:
        await replies.aclose()  # type: ignore[attr-defined]
    entry = booked.entries[0]
    assert (entry.request_id, entry.outcome) == ("r1", "client_disconnected")
