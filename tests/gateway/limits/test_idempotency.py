"""Idempotency keys end to end through two edges and a worker: a repeat runs nothing."""

from __future__ import annotations

import asyncio
import dataclasses

import redis.asyncio as aioredis

from gateway.limits.idempotency import Idempotency
from gateway.queue.dispatcher import Dispatcher
from gateway.queue.keys import RedisKeys
from gateway.queue.replies import ReplyRouter
from tests.gateway.queue.conftest import Collect, Edge, job, start_node


async def test_a_repeat_gets_the_first_answer_and_runs_nothing(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    sim = await start_sim(4, itl_s=0.05)
    keys = RedisKeys(key_prefix)
    idem = Idempotency(redis_conn, key_prefix, ttl_s=60)
    edges = []
    for name in ("e1", "e2"):
        replies = ReplyRouter(redis_conn, keys.replies(name), block_ms=200)
        replies.start()
        dispatcher = Dispatcher(
            redis_conn, keys, replies, max_depth=100, claim_ttl_s=60, idempotency=idem
        )
        edges.append(Edge(dispatcher, replies, name))
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1")
    node.worker._idempotency = idem  # what services wires
    try:
        first = dataclasses.replace(job("r1", "e1"), idempotency_key="k-1")
        repeat = dataclasses.replace(job("r2", "e2"), idempotency_key="k-1")
        other = dataclasses.replace(job("r3", "e2"), idempotency_key="k-2")
        a, b, c = await asyncio.gather(
            edges[0].call(first), edges[1].call(repeat), edges[1].call(other)
        )
        late, _ = await edges[0].call(dataclasses.replace(job("r4", "e1"), idempotency_key="k-1"))
    finally:
        await node.aclose()
        for e in edges:
            await e.replies.aclose()
    assert a[0].kind == b[0].kind == c[0].kind == late.kind == "result"
    assert b[0].data == a[0].data == late.data  # the same answer
    # whichever claimed the key first ran; the other one is the replay
    assert sorted(bool(x[0].meta.get("replayed")) for x in (a, b)) == [False, True]
    assert late.meta.get("replayed") is True
    assert c[0].data != a[0].data
    assert len(sim.served) == 2  # k-1 once, k-2 once
    booked_ids = sorted(e.request_id for e in booked.entries)
    assert booked_ids in (["r1", "r3"], ["r2", "r3"])
