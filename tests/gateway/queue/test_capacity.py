"""Global capacity: slot leases in Redis bound in-flight work per replica across processes."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from tests.gateway.queue.conftest import Collect, Edge, gather_calls, job, start_node


async def test_leases_refuse_over_the_limit_and_expire(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    leases = SlotLeases(redis_conn, lease_ms=400)
    key = RedisKeys(key_prefix).slots("small", "m#0")
    assert await leases.acquire(key, "a", 2)
    assert await leases.acquire(key, "b", 2)
    assert not await leases.acquire(key, "c", 2)
    await leases.release(key, "a")
    assert await leases.acquire(key, "c", 2)
    assert await leases.held([key]) == [2]
    # "b" is renewed, "c" is not (its holder died): only "c"'s slot comes back.
    await asyncio.sleep(0.25)
    assert await leases.renew([(key, "b")]) == 1
    await asyncio.sleep(0.25)
    assert await leases.held([key]) == [1]
    assert await leases.acquire(key, "d", 2)
    assert not await leases.acquire(key, "e", 2)


async def test_a_renewal_brings_back_no_released_lease(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    leases = SlotLeases(redis_conn, lease_ms=10_000)
    key = RedisKeys(key_prefix).slots("small", "m#0")
    assert await leases.acquire(key, "a", 2)
    assert await leases.acquire(key, "b", 2)
    assert await leases.renew([(key, "a"), (key, "b")]) == 2
    await leases.release(key, "a")
    # "a" was released while a renewal naming it was on its way: it stays released.
    assert await leases.renew([(key, "a"), (key, "b")]) == 1
    assert await leases.held([key]) == [1]


async def test_leases_come_back_with_the_first_renewal_after_a_redis_loss(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    leases = SlotLeases(redis_conn, lease_ms=10_000)
    other = SlotLeases(redis_conn, lease_ms=10_000)  # another process
    keys = RedisKeys(key_prefix)
    key = keys.slots("small", "m#0")
    assert await leases.acquire(key, "a", 2)
    assert await other.acquire(key, "b", 2)
    assert await leases.renew([(key, "a")]) == 1
    assert await other.renew([(key, "b")]) == 1
    async for stale in redis_conn.scan_iter(match=f"{key_prefix}:*"):
        await redis_conn.delete(stale)  # Redis lost everything; "a" and "b" still run
    assert await leases.acquire(key, "c", 2)  # granted before the holders' next renewal
    assert await leases.renew([(key, "a")]) == 1
    assert await other.renew([(key, "b")]) == 1
    assert await leases.held([key]) == [3]  # the truth: three jobs on two slots
    assert not await leases.acquire(key, "d", 2)
    for lease in ("a", "b", "c"):
        await leases.release(key, lease)
    assert await leases.acquire(key, "d", 2)


async def test_two_workers_never_exceed_a_replicas_capacity(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,
    edge: Edge,  # type: ignore[no-untyped-def]
) -> None:
    """Two worker "processes" (own pools, own lease owners) share one replica of capacity 3;
    each alone could send 3, so without global leases the replica would see up to 6."""
    sim = await start_sim(3)
    keys = RedisKeys(key_prefix)
    booked = Collect()
    nodes = [await start_node(redis_conn, keys, [sim], booked, f"w{i}") for i in range(2)]
    try:
        results = await gather_calls(edge, [job(f"r{i}", edge.edge_id) for i in range(30)])
    finally:
        for node in nodes:
            await node.aclose()
    assert [r.kind for r, _ in results] == ["result"] * 30
    assert len(sim.served) == 30
    assert 2 <= sim.peak <= 3
    assert sorted(e.request_id for e in booked.entries) == sorted(f"r{i}" for i in range(30))
    assert await redis_conn.zcard(keys.slots("small", "llama-3.1-8b-instruct#0")) == 0
