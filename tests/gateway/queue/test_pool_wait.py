"""A lease with no slot free waits for one: it gets the slot released meanwhile, gives up with
503 ``no free slot`` at its deadline or the pool's ``max_wait_s``, and at once when the
deployment's last replica leaves while it waits."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from backends.errors import BackendUnavailable
from backends.scripted import ScriptedBackend
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica, Reservation


async def _busy_pool(
    redis: aioredis.Redis, prefix: str, *, max_wait_s: float
) -> tuple[BackendPool, Reservation]:
    """A pool of one replica with one slot, and the reservation that holds it."""
    slot_key = RedisKeys(prefix).slots("small", "m@a")
    replica = Replica(ScriptedBackend("m@a", []), 1, slot_key=slot_key)
    pool = BackendPool({"m": [replica]}, leases=SlotLeases(redis), max_wait_s=max_wait_s)
    held = await pool.reserve(["m"])
    assert held is not None
    return pool, held


async def test_a_slot_released_while_waiting_is_taken(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    pool, held = await _busy_pool(redis_conn, key_prefix, max_wait_s=5)

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await pool.release(held)

    releasing = asyncio.create_task(release_soon())
    started = time.monotonic()
    async with pool.lease("m") as backend:
        waited = time.monotonic() - started
        assert backend.name == "m@a"
    await releasing
    assert 0.15 < waited < 1.0  # polled: taken within a pause (<= 50 ms) of the release
    assert await SlotLeases(redis_conn).held([held.replica.slot_key]) == [0]
    await pool.aclose()


@pytest.mark.parametrize(("max_wait_s", "deadline_in_s"), [(0.3, None), (5.0, 0.3)])
async def test_no_free_slot_gives_up_at_the_first_bound(
    redis_conn: aioredis.Redis, key_prefix: str, max_wait_s: float, deadline_in_s: float | None
) -> None:
    pool, held = await _busy_pool(redis_conn, key_prefix, max_wait_s=max_wait_s)
    deadline = None if deadline_in_s is None else time.time() + deadline_in_s
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="no free slot"):
        async with pool.lease("m", deadline=deadline):
            pass
    assert 0.2 < time.monotonic() - started < 0.6
    await pool.release(held)
    await pool.aclose()


async def test_the_last_replica_leaving_ends_the_wait(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    pool, held = await _busy_pool(redis_conn, key_prefix, max_wait_s=5)

    async def leave_soon() -> None:
        await asyncio.sleep(0.2)
        pool.set_replicas("m", [])

    leaving = asyncio.create_task(leave_soon())
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="no replica is ready"):
        async with pool.lease("m"):
            pass
    await leaving
    assert time.monotonic() - started < 1.0  # not after max_wait_s
    await pool.release(held)
    await pool.aclose()
