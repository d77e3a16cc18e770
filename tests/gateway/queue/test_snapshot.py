"""The cached queue snapshot: expected waits for the router, gauges for autoscaling."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from prometheus_client import generate_latest

from gateway.errors import RateLimited
from gateway.metrics import Metrics
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.edge.signals import publish_queue_metrics
from gateway.queue.edge.snapshot import QueueSnapshot, TierQueue
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue
from gateway.queue.replicas.capacity import SlotLeases
from router.catalog import Tier
from tests.gateway.queue.conftest import job


async def test_expected_wait_and_gauges(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    keys = RedisKeys(key_prefix)
    slot = keys.slots("small", "m#0")
    tiers = {
        "small": TierQueue(
            capacity=2, slot_keys=(slot,), slot_deployments=("m",), deployment_capacity={"m": 2}
        )
    }
    snapshot = QueueSnapshot(redis_conn, keys, tiers)
    await snapshot.refresh()
    assert snapshot.expected_wait("small") == 0.0  # idle: no wait
    assert snapshot.service_times() == {Tier.SMALL: 1.0}  # none published yet: the default

    q = LaneQueue(redis_conn, keys)
    for _ in range(4):
        await q.enqueue(tier="small", lane="batch", tenant="b", job=b"x", weight=1, max_depth=99)
    await q.enqueue(tier="small", lane="interactive", tenant="a", job=b"y", weight=1, max_depth=9)
    leases = SlotLeases(redis_conn)
    assert await leases.acquire(slot, "l1", 2)
    assert await leases.acquire(slot, "l2", 2)
    await redis_conn.set(keys.service_time("small"), "2.0")
    before = time.time()
    await snapshot.refresh()
    view = snapshot.view("small")
    assert view.depth == {"interactive": 1, "standard": 0, "batch": 4}
    assert view.held == 2
    # 5 waiting + 1 beyond a full tier, 2 s each, 2 slots: 6 s
    assert snapshot.expected_wait("small") == pytest.approx(6.0)
    assert snapshot.service_times() == {Tier.SMALL: 2.0}  # what deadline spill-over reads
    assert 0.0 <= view.oldest_age_s["batch"] < time.time() - before + 1.0

    metrics = Metrics()
    publish_queue_metrics(snapshot, metrics)
    text = generate_latest(metrics.registry).decode()
    assert 'tiergate_queue_lane_depth{lane="batch",tier="small"} 4.0' in text
    assert 'tiergate_inflight_requests{deployment="m"} 2.0' in text
    assert 'tiergate_capacity_slots{deployment="m"} 2.0' in text
    assert 'tiergate_queue_expected_wait_seconds{tier="small"} 6.0' in text


async def test_a_full_lane_answers_429_with_the_expected_wait(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e9"), block_ms=100)
    dispatcher = Dispatcher(
        redis_conn, keys, replies, max_depth=1, claim_ttl_s=60, expected_wait=lambda t: 7.2
    )
    await dispatcher.submit(job("a", "e9"))
    with pytest.raises(RateLimited) as info:
        await dispatcher.submit(job("b", "e9"))
    assert info.value.retry_after == 8.0
