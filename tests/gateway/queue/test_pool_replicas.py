"""A deployment's replicas change while the pool runs (pods found by discovery): new ones take
slots, one that leaves gets no new lease but keeps its running calls, and a deployment with no
replica refuses a lease at once instead of waiting for a slot."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from backends.errors import BackendUnavailable
from backends.scripted import ScriptedBackend
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import IDLE_MARK, BackendPool, Replica


def _replica(keys: RedisKeys, pod: str) -> Replica:
    """A replica whose backend is never called: only its slots are leased."""
    name = f"m@{pod}"
    return Replica(ScriptedBackend(name, []), 1, slot_key=keys.slots("small", name))


async def test_replicas_join_and_leave(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    keys = RedisKeys(key_prefix)
    a, b = _replica(keys, "a"), _replica(keys, "b")
    pool = BackendPool({"m": [a]}, leases=SlotLeases(redis_conn), max_wait_s=5)
    held = await pool.reserve(["m"])
    assert held is not None and held.replica is a
    assert await pool.reserve(["m"]) is None  # a's one slot is taken

    left = pool.set_replicas("m", [_replica(keys, "a"), b])
    assert left == [] and pool.replicas("m")[0] is a  # kept as it was, its count too
    got = await pool.reserve(["m"])
    assert got is not None and got.replica is b  # the new pod takes work

    assert pool.set_replicas("m", [b]) == [a]  # a leaves while its call runs
    assert pool.capacity("m") == 1 and pool.slot_keys(["m"]) == [b.slot_key]
    await pool.release(held)  # the call on a ends normally; its lease goes
    assert await SlotLeases(redis_conn).held([a.slot_key]) == [0]
    await pool.release(got)

    pool.set_replicas("m", [])
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="no replica"):
        async with pool.lease("m"):
            pass
    assert time.monotonic() - started < 0.5  # at once, not after max_wait_s
    await pool.aclose()


async def test_an_idle_reservation_turns_busy(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    keys = RedisKeys(key_prefix)
    leases = SlotLeases(redis_conn)
    a = _replica(keys, "a")
    pool = BackendPool({"m": [a]}, leases=leases)
    idle = await pool.reserve(["m"], idle=True)
    assert idle is not None and idle.lease_id.endswith(IDLE_MARK)
    assert await leases.held_busy([a.slot_key], IDLE_MARK) == [(1, 0)]
    busy = await pool.busy(idle)
    assert not busy.lease_id.endswith(IDLE_MARK)
    assert await leases.held_busy([a.slot_key], IDLE_MARK) == [(1, 1)]
    await pool.release(busy)
    assert await leases.held_busy([a.slot_key], IDLE_MARK) == [(0, 0)]
    await pool.aclose()
