"""A worker in its edge's process hands the replies over in memory: the answer arrives and the
edge's reply stream is never written. Another edge's jobs still go through its stream."""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.keys import RedisKeys
from gateway.queue.running.replying import EdgeBeside
from tests.gateway.queue.conftest import Collect, Edge, job, start_node


async def test_a_worker_beside_its_edge_answers_in_memory(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,
    edge: Edge,  # type: ignore[no-untyped-def]
) -> None:
    keys = RedisKeys(key_prefix)
    sim = await start_sim(capacity=4)
    ledger = Collect()
    node = await start_node(
        redis_conn, keys, [sim], ledger, "w1", local_edge=EdgeBeside(edge.edge_id, edge.replies)
    )
    other = ReplyRouter(redis_conn, keys.replies("edge2"), block_ms=200)
    other.start()
    try:
        queued = [job(f"r{n}", edge.edge_id) for n in range(6)]  # more than the 4 slots
        for n, (reply, _wait) in enumerate([await edge.call(j) for j in queued]):
            assert reply.kind == "result", reply
            assert reply.request_id == f"r{n}"
        assert await redis_conn.xlen(keys.replies(edge.edge_id)) == 0

        # A job whose edge is in another process: through that edge's reply stream.
        waiter = other.register("x1")
        stream = await edge.dispatcher.submit(job("x1", "edge2"))
        assert stream is not None
        reply = await waiter.get()
        assert not isinstance(reply, BaseException) and reply.kind == "result"
        assert await redis_conn.xlen(keys.replies("edge2")) >= 1
    finally:
        await other.aclose()
        await node.aclose()
    assert sorted(e.request_id for e in ledger.entries) == [*(f"r{n}" for n in range(6)), "x1"]
