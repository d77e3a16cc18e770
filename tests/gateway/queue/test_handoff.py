"""Hand-off: an enqueue gives a job that need not wait straight to an idle worker (claim taken
for it), without overtaking queued work, never beyond the slots the idle workers hold, and a
job handed to a worker that died is reclaimed like any job it had started."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.queue.keys import DIRECT_LANE, RedisKeys
from gateway.queue.lanes import HANDED_OFF, Handoff, LaneQueue, Taken
from tests.gateway.queue.conftest import Collect, Edge, gather_calls, job, start_node
from tests.support import until

IDLE_MS = 5_000


async def _idle(q: LaneQueue, worker: str, idle_ms: int = IDLE_MS) -> None:
    """``worker`` holds a slot and finds nothing: registered as idle."""
    assert await q.take("small", worker, slot_keys=[], batch_limit=-1, idle_ms=idle_ms) is None


async def _enqueue(q: LaneQueue, request_id: str, lane: str, tenant: str = "acme") -> int:
    return await q.enqueue(
        tier="small", lane=lane, tenant=tenant, job=job(request_id, "e", tenant=tenant).encode(),
        weight=1.0, max_depth=100, handoff=Handoff(request_id, 60),
    )  # fmt: skip


def _request(taken: Taken | None) -> str:
    assert taken is not None
    return taken.job.split(b'"request_id":"', 1)[1].split(b'"', 1)[0].decode()


async def test_a_job_that_need_not_wait_goes_to_an_idle_worker_with_its_claim(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    q = LaneQueue(redis_conn, keys)
    await _idle(q, "w1")
    assert await _enqueue(q, "r1", "standard") == HANDED_OFF
    assert await redis_conn.get(keys.claim("small", "r1")) == b"w1"
    assert await redis_conn.zscore(keys.idle("small"), "w1") is None  # one job per registration
    direct = keys.jobs("small", DIRECT_LANE, "acme")
    pending = await redis_conn.xpending(direct, keys.group)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == b"w1"
    assert await redis_conn.sismember(keys.streams("small"), direct)  # where reclaim looks
    assert await q.depths("small") == {"interactive": 0, "standard": 0, "batch": 0}

    woke = await redis_conn.blpop(q.wake_keys("small", "w1"), timeout=1)
    assert woke is not None and woke[0] == keys.wake("small", "w1").encode()
    taken = q.handed("small", woke[1])
    assert taken.claimed and taken.lane == DIRECT_LANE and taken.tenant == "acme"
    assert _request(taken) == "r1"
    assert (await redis_conn.xrange(direct))[0][0] == taken.entry_id

    # Used up: the next job waits in its lane, and rings the bell for the workers.
    assert await _enqueue(q, "r2", "standard") == 1
    assert await redis_conn.get(keys.claim("small", "r2")) is None


async def test_hand_off_never_overtakes_queued_work_and_skips_batch(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    q = LaneQueue(redis_conn, keys)
    await _idle(q, "w1")
    # An enqueue without hand-off: a1 waits (the bell would wake w1; it has not taken a1 yet).
    await q.enqueue(
        tier="small", lane="standard", tenant="a", job=job("a1", "e", tenant="a").encode(),
        weight=1.0, max_depth=100,
    )  # fmt: skip
    assert await _enqueue(q, "b1", "standard", tenant="b") == 2  # behind a1: fair share
    assert await _enqueue(q, "x1", "batch") == 1  # batch never: only a worker knows headroom
    assert await _enqueue(q, "i1", "interactive") == HANDED_OFF  # nothing waits above
    assert await _enqueue(q, "i2", "interactive") == 1  # w1's one slot is taken: queued

    order = []
    for _ in range(5):
        taken = await q.take("small", "w1", slot_keys=[], batch_limit=-1, idle_ms=IDLE_MS)
        order.append(_request(taken))
        await q.ack(taken)  # type: ignore[arg-type]
    assert order == ["i1", "i2", "a1", "b1", "x1"]  # the handed job first, then lane order
    assert await q.take("small", "w1", slot_keys=[], batch_limit=-1, idle_ms=IDLE_MS) is None


async def test_a_lapsed_or_withdrawn_registration_gets_nothing(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    q = LaneQueue(redis_conn, keys)
    await _idle(q, "gone", idle_ms=50)  # a worker that stopped renewing
    await asyncio.sleep(0.1)
    assert await _enqueue(q, "r1", "standard") == 1
    await q.ack(await q.take("small", "w0", slot_keys=[], batch_limit=-1))  # type: ignore[arg-type]

    await _idle(q, "w1")
    await _idle(q, "w2")
    assert await _enqueue(q, "r2", "interactive") == HANDED_OFF  # the newest registration
    assert await redis_conn.get(keys.claim("small", "r2")) == b"w2"
    handed = await q.withdraw("small", "w2")  # stopping: takes back what it was handed
    assert [_request(t) for t in handed] == ["r2"] and handed[0].claimed
    assert await q.withdraw("small", "w1") == []
    assert await redis_conn.zcard(keys.idle("small")) == 0
    assert await _enqueue(q, "r3", "interactive") == 1


async def test_idle_workers_are_handed_jobs_and_capacity_holds(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    """Two worker "processes" share a replica of capacity 2: each idle one holds one slot, so
    hand-offs never put more than 2 on it; the rest waits in the lane."""
    sim = await start_sim(2, itl_s=0.02)
    keys = RedisKeys(key_prefix)
    booked = Collect()
    nodes = [await start_node(redis_conn, keys, [sim], booked, f"w{i}") for i in range(2)]
    try:
        await until(lambda: _equals(redis_conn.zcard(keys.idle("small")), 2), 5)
        first, _wait = await edge.call(job("r0", edge.edge_id))
        assert await redis_conn.exists(keys.jobs("small", "standard", "acme")) == 0  # no lane
        results = await gather_calls(edge, [job(f"r{i}", edge.edge_id) for i in range(1, 13)])
        stopping = nodes[0].worker.stop_taking()
        await stopping
        await until(lambda: _equals(redis_conn.zcard(keys.idle("small")), 1), 5)
        assert await redis_conn.zscore(keys.idle("small"), "w0") is None  # withdrawn
        last, _wait = await edge.call(job("r13", edge.edge_id))
    finally:
        for node in nodes:
            await node.aclose()
    assert first.kind == "result" and last.kind == "result"
    assert [r.kind for r, _ in results] == ["result"] * 12
    assert sim.peak <= 2
    assert sorted(e.request_id for e in booked.entries) == sorted(f"r{i}" for i in range(14))
    assert await redis_conn.get(keys.claim("small", "r13")) == b"done:w1"
    assert await redis_conn.zcard(keys.slots("small", "llama-3.1-8b-instruct#0")) == 0


async def _equals(value, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(await value == expected)


async def test_a_job_handed_to_a_worker_that_died_is_reclaimed_and_run_once(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    sim = await start_sim(2, time_scale=0.0)
    keys = RedisKeys(key_prefix)
    q = LaneQueue(redis_conn, keys)
    await _idle(q, "w-dead")  # registered, then its process died (no heartbeat)
    answer = asyncio.create_task(edge.call(job("r1", edge.edge_id, timeout_s=30)))
    await until(lambda: _equals(redis_conn.exists(keys.claim("small", "r1")), 1), 5)
    assert await redis_conn.get(keys.claim("small", "r1")) == b"w-dead"
    booked = Collect()
    survivor = await start_node(
        redis_conn, keys, [sim], booked, "survivor", reclaim_idle_s=0.6, heartbeat_s=0.2
    )
    try:
        reply, _wait = await asyncio.wait_for(answer, 15)
        await asyncio.sleep(0.5)  # a second reclaim round must not run it again
    finally:
        await survivor.aclose()
    assert reply.kind == "result"
    assert [e.request_id for e in booked.entries] == ["r1"]
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:survivor"
    assert len(sim.served) == 1
