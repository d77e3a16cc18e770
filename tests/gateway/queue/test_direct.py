"""Direct start: a job that would be taken at once starts in the edge's own worker, keeps lane
order, capacity and fair share, and is recovered like any started job if its process dies."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.running.direct import DIRECT_LANE, DirectStart
from tests.gateway.queue.conftest import MODEL, Collect, job, start_node
from tests.support import until


async def test_a_job_that_need_not_wait_starts_at_once_and_answers_its_waiter_directly(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    sim = await start_sim(4, time_scale=0.0)
    keys = RedisKeys(key_prefix)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w-local")
    replies = ReplyRouter(redis_conn, keys.replies("edge1"))  # never started: nothing queued
    dispatcher = Dispatcher(
        redis_conn, keys, replies, max_depth=100, claim_ttl_s=60, local=node.worker
    )
    try:
        stream = await dispatcher.submit(job("r1", "edge1"))
        final = [reply async for reply in stream][-1]
        direct = keys.jobs("small", DIRECT_LANE, "acme")
        await until(lambda: _equals(redis_conn.xlen(direct), 0), 5)  # acknowledged, deleted
    finally:
        await node.aclose()
    assert final.kind == "result"
    assert final.meta.deployment == MODEL
    assert [e.request_id for e in booked.entries] == ["r1"]
    assert len(sim.served) == 1
    assert await redis_conn.exists(keys.replies("edge1")) == 0  # no reply stream involved
    depths = await LaneQueue(redis_conn, keys).depths("small")
    assert depths == {"interactive": 0, "standard": 0, "batch": 0}
    assert await redis_conn.sismember(keys.streams("small"), direct)  # where reclaim looks


async def _equals(value, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(await value == expected)


async def test_work_waiting_in_the_lane_or_above_a_full_replica_or_batch_headroom_queues(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    starter = DirectStart(redis_conn, keys)
    slot = keys.slots("small", f"{MODEL}#0")

    async def start(request_id: str, lane: str, *, capacity: int = 2, batch_limit: int = -1):  # type: ignore[no-untyped-def]
        return await starter.start(
            tier="small", lane=lane, tenant="acme", job=job(request_id, "e").encode(),
            weight=1.0, consumer="w1", slots=[(slot, capacity)], lease_id=f"lease-{request_id}",
            lease_ms=30_000, batch_limit=batch_limit,
        )  # fmt: skip

    await LaneQueue(redis_conn, keys).enqueue(
        tier="small", lane="standard", tenant="other", job=job("q1", "e").encode(),
        weight=1.0, max_depth=10,
    )  # fmt: skip
    assert await start("s1", "standard") is None  # q1 waits in its lane: it goes first
    assert await start("b1", "batch") is None  # and batch waits behind standard
    started = await start("i1", "interactive")  # a higher lane does not wait for standard
    assert started is not None and started.slot == 0
    assert started.taken.lane == DIRECT_LANE
    assert await SlotLeases(redis_conn).held([slot]) == [1]
    pending = await redis_conn.xpending(keys.jobs("small", DIRECT_LANE, "acme"), keys.group)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == b"w1"

    assert await start("i2", "interactive", capacity=1) is None  # the replica is full
    await redis_conn.delete(keys.depth("small", "standard"))  # q1 was taken
    assert await start("b2", "batch", capacity=4, batch_limit=0) is None  # headroom kept
    assert await start("b3", "batch", capacity=4, batch_limit=1) is not None


async def test_a_job_started_at_once_by_a_process_that_died_is_reclaimed_and_run_once(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    sim = await start_sim(3, time_scale=0.0)  # the dead lease holds a slot until it expires
    keys = RedisKeys(key_prefix)
    slot = keys.slots("small", f"{MODEL}#0")
    started = await DirectStart(redis_conn, keys).start(
        tier="small", lane="standard", tenant="acme", job=job("r1", "edge1").encode(),
        weight=1.0, consumer="w-dead", slots=[(slot, 3)], lease_id="w-dead:0",
        lease_ms=30_000, batch_limit=-1,
    )  # fmt: skip
    assert started is not None  # ... and then its process died (no heartbeat, no renewal)
    booked = Collect()
    survivor = await start_node(
        redis_conn, keys, [sim], booked, "survivor", reclaim_idle_s=0.6, heartbeat_s=0.2
    )
    try:
        for _ in range(100):
            if booked.entries:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a second reclaim round must not run it again
    finally:
        await survivor.aclose()
    assert [e.request_id for e in booked.entries] == ["r1"]
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:survivor"


async def test_a_client_gone_before_its_started_job_runs_is_booked_once_by_the_worker(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    """The client leaves right after its job was started at once, before the job's task has
    run: a job started at once has no claim key, so the edge must not claim it (it would win,
    book a refusal, and the job would run and be booked as well). The worker books it once,
    as its client left, and calls nothing."""
    sim = await start_sim(4, time_scale=0.0)
    keys = RedisKeys(key_prefix)
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w-local")
    replies = ReplyRouter(redis_conn, keys.replies("edge1"))
    dispatcher = Dispatcher(
        redis_conn, keys, replies, max_depth=100, claim_ttl_s=60, local=node.worker
    )
    try:
        j = job("r1", "edge1")
        stream = await dispatcher.submit(j)  # started at once; its task has not run yet
        assert await dispatcher.abandon(j) is False  # booked by its worker, not here
        await until(lambda: bool(booked.entries), 5)
        await stream.aclose()  # type: ignore[attr-defined]  # what the gone client's handler drops
    finally:
        await node.aclose()
    assert [(e.request_id, e.outcome, e.status_code) for e in booked.entries] == [
        ("r1", "client_disconnected", 499)
    ]
    assert len(sim.served) == 0
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:w-local"  # not the edge's
