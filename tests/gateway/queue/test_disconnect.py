"""A client that goes away: its queued job is dropped, its running job is stopped on whichever
worker runs it, and the ledger gets one row, ``client_disconnected`` (499) (real Redis, real
simulator, workers in this process)."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from gateway.queue.edge.dispatcher import EDGE_CLAIM
from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import Collect, Edge, job, start_node
from tests.support import until


async def test_a_queued_job_whose_client_left_is_never_run(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    sim = await start_sim(2, time_scale=0.0)
    keys = RedisKeys(key_prefix)
    waiting = job("r1", edge.edge_id)
    replies = await edge.dispatcher.submit(waiting)  # no worker yet: it waits in Redis
    assert await edge.dispatcher.abandon(waiting)  # the edge owns it now: it books the 499
    assert await redis_conn.get(keys.claim("small", "r1")) == EDGE_CLAIM.encode()
    # held past the job's deadline (30 s) like a worker's claim: no worker starts it before
    assert await redis_conn.ttl(keys.claim("small", "r1")) > 60
    await replies.aclose()  # type: ignore[attr-defined]
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1")
    try:
        later = job("r2", edge.edge_id)
        reply, _ = await edge.call(later)  # the worker is alive and serves what comes next
    finally:
        await node.aclose()
    assert reply.kind == "result"
    assert [e.request_id for e in booked.entries] == ["r2"]
    assert sim.served == ["r2"]  # r1 never reached the backend


async def test_a_running_job_whose_client_left_is_stopped_by_its_worker_and_booked_499(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    sim = await start_sim(2, itl_s=0.05)  # 200 tokens: ~10 s unless stopped
    keys = RedisKeys(key_prefix)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w-remote")
    try:
        running = job("r1", edge.edge_id, max_tokens=200)
        replies = await edge.dispatcher.submit(running)
        await until(lambda: sim.now == 1, 10)  # the worker is calling the backend
        started = time.monotonic()
        assert not await edge.dispatcher.abandon(running)  # a worker owns it: told to stop
        await until(lambda: bool(booked.entries), 5)
        stopped_in = time.monotonic() - started
        await replies.aclose()  # type: ignore[attr-defined]
        await until(lambda: sim.now == 0, 5)  # the backend call was aborted
    finally:
        await node.aclose()
    entry = booked.entries[0]
    assert (entry.request_id, entry.outcome, entry.status_code) == (
        "r1",
        "client_disconnected",
        499,
    )
    assert [a.outcome for a in entry.attempts] == ["cancelled"]
    assert stopped_in < 2.0


async def test_a_cancel_heard_before_its_job_runs_here_stops_it_when_it_starts(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    """An edge publishes its cancel once a worker's claim has won, and the message can reach
    that worker before its task has registered the job as running. The worker keeps the cancel
    (``EarlyCancels``): the job, when it starts, ends at once, booked 499 without a call, not
    run in full for a client that has gone. Here the cancel comes first outright."""
    sim = await start_sim(2, time_scale=0.0)
    keys = RedisKeys(key_prefix)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w-late")
    try:
        assert not node.worker.cancel("r-early")  # what its listener calls: nothing runs yet
        replies = await edge.dispatcher.submit(job("r-early", edge.edge_id))
        await until(lambda: bool(booked.entries), 5)
        await replies.aclose()  # type: ignore[attr-defined]
        later, _ = await edge.call(job("r-later", edge.edge_id))  # kept no longer than needed
    finally:
        await node.aclose()
    entry = booked.entries[0]
    assert (entry.request_id, entry.outcome, entry.status_code) == (
        "r-early",
        "client_disconnected",
        499,
    )
    assert entry.attempts == ()
    assert later.kind == "result"
    assert sim.served == ["r-later"]  # r-early never reached the backend
