"""``tiergate_inflight_requests`` counts running jobs, not the slot an idle worker holds while it
waits for one: an idle pool reads 0, the condition scale-to-zero is documented on."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from prometheus_client import generate_latest

from gateway.metrics import Metrics
from gateway.queue.edge.signals import publish_queue_metrics
from gateway.queue.edge.snapshot import QueueSnapshot, TierQueue
from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import MODEL, Collect, Edge, job, start_node
from tests.support import until


def _gauge(metrics: Metrics) -> str:
    text = generate_latest(metrics.registry).decode()
    return next(s for s in text.splitlines() if s.startswith("tiergate_inflight_requests{"))


async def test_an_idle_worker_holds_a_slot_but_nothing_is_in_flight(
    redis_conn: aioredis.Redis, key_prefix: str, start_sim, edge: Edge
) -> None:
    keys = RedisKeys(key_prefix)
    sim = await start_sim(4, time_scale=1.0, itl_s=0.05)
    node = await start_node(redis_conn, keys, [sim], Collect(), "w1")
    slot = keys.slots("small", f"{MODEL}#0")
    tiers = {
        "small": TierQueue(
            capacity=4, slot_keys=(slot,), slot_deployments=(MODEL,), deployment_capacity={MODEL: 4}
        )
    }
    snapshot = QueueSnapshot(redis_conn, keys, tiers)
    metrics = Metrics()
    try:

        async def idle_slot_held() -> bool:
            await snapshot.refresh()
            return snapshot.view("small").held == 1

        await until(idle_slot_held, 5.0)  # the worker waits for a job on a reserved slot
        publish_queue_metrics(snapshot, metrics)
        assert _gauge(metrics) == f'tiergate_inflight_requests{{deployment="{MODEL}"}} 0.0'

        call = asyncio.create_task(edge.call(job("r1", edge.edge_id, max_tokens=40)))
        await until(lambda: sim.now == 1, 5.0)  # running on the replica (40 tokens, ~2 s)
        await snapshot.refresh()
        publish_queue_metrics(snapshot, metrics)
        assert _gauge(metrics) == f'tiergate_inflight_requests{{deployment="{MODEL}"}} 1.0'
        reply, _ = await call
        assert reply.kind == "result"

        async def idle_again() -> bool:
            await snapshot.refresh()
            view = snapshot.view("small")
            return view.held == 1 and sum(view.busy_by_key.values()) == 0

        await until(idle_again, 5.0)
        publish_queue_metrics(snapshot, metrics)
        assert _gauge(metrics) == f'tiergate_inflight_requests{{deployment="{MODEL}"}} 0.0'
    finally:
        await node.aclose()
