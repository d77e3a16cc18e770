"""Lanes (strict priority, batch headroom) and weighted fair share, on a real Redis."""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue, QueueFull
from gateway.queue.replicas.capacity import SlotLeases


async def _put(q: LaneQueue, tenant: str, lane: str, n: int, weight: float = 1.0) -> None:
    for i in range(n):
        await q.enqueue(
            tier="small", lane=lane, tenant=tenant, job=f"{tenant}{i}".encode(), weight=weight,
            max_depth=1000,
        )  # fmt: skip


async def _order(q: LaneQueue, n: int, **kw: object) -> list[str]:
    out = []
    for _ in range(n):
        taken = await q.take(
            "small",
            "w",
            slot_keys=kw.get("slot_keys", []),  # type: ignore[arg-type]
            batch_limit=kw.get("batch_limit", -1),  # type: ignore[arg-type]
        )
        if taken is None:
            break
        out.append(taken.job.decode())
        await q.ack(taken)
    return out


async def test_interactive_before_standard_before_batch(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    q = LaneQueue(redis_conn, RedisKeys(key_prefix))
    await _put(q, "bulk", "batch", 2)
    await _put(q, "std", "standard", 1)
    await _put(q, "app", "interactive", 1)
    assert await _order(q, 10) == ["app0", "std0", "bulk0", "bulk1"]
    assert await q.depths("small") == {"interactive": 0, "standard": 0, "batch": 0}


async def test_a_burst_does_not_starve_another_tenant(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    q = LaneQueue(redis_conn, RedisKeys(key_prefix))
    await _put(q, "a", "standard", 20)  # a's burst arrives first
    assert await _order(q, 4) == ["a0", "a1", "a2", "a3"]
    await _put(q, "b", "standard", 3)
    # b joins at the lane's lowest score (a tie, broken by name): it alternates with a, never
    # waits for a's 16 left.
    assert await _order(q, 6) == ["a4", "b0", "a5", "b1", "a6", "b2"]


async def test_weights_set_the_shares(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    q = LaneQueue(redis_conn, RedisKeys(key_prefix))
    await _put(q, "big", "standard", 20, weight=3.0)
    await _put(q, "small", "standard", 20, weight=1.0)
    got = await _order(q, 20)
    big = sum(1 for j in got if j.startswith("big"))
    assert 14 <= big <= 16  # 3:1 of 20


async def test_batch_waits_while_the_headroom_is_used(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    q = LaneQueue(redis_conn, keys)
    leases = SlotLeases(redis_conn)
    slot = keys.slots("small", "m#0")
    for i in range(4):
        assert await leases.acquire(slot, f"l{i}", 4)
    await _put(q, "bulk", "batch", 1)
    await _put(q, "app", "interactive", 1)
    # 4 of 4 slots held, batch may hold at most 3: only the interactive job is taken.
    assert await _order(q, 5, slot_keys=[slot], batch_limit=3) == ["app0"]
    await leases.release(slot, "l0")
    assert await _order(q, 5, slot_keys=[slot], batch_limit=3) == ["bulk0"]


async def test_depth_limit_is_per_tier_and_lane(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    q = LaneQueue(redis_conn, RedisKeys(key_prefix))
    for _ in range(2):
        await q.enqueue(tier="small", lane="batch", tenant="t", job=b"x", weight=1, max_depth=2)
    try:
        await q.enqueue(tier="small", lane="batch", tenant="u", job=b"x", weight=1, max_depth=2)
    except QueueFull as full:
        assert full.depth == 2
    else:
        raise AssertionError("a third job was queued over max_depth=2")
    # a full batch lane refuses nobody else: not interactive work, not another tier
    await q.enqueue(tier="small", lane="interactive", tenant="t", job=b"x", weight=1, max_depth=2)
    await q.enqueue(tier="large", lane="batch", tenant="t", job=b"x", weight=1, max_depth=2)
