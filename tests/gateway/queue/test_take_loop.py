"""A tier's take loop (``TakeLoop``) on a real Redis, its pauses recorded instead of slept: it
polls for a free slot 2 ms -> 50 ms, backs off 50 ms -> 1 s while Redis fails, and gives back
the slot it holds when stopped."""

from __future__ import annotations

import asyncio
import socket

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from backends.scripted import ScriptedBackend
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue, Taken
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import IDLE_MARK, BackendPool, Replica, Reservation
from gateway.queue.running.taking import TakeLoop
from gateway.tasks import stop_task


class Pauses:
    """Records each pause; ``until`` pauses later it lets the loop be stopped."""

    def __init__(self, until: int) -> None:
        self.seen: list[float] = []
        self.until = until
        self.enough = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.seen.append(round(seconds, 4))
        if len(self.seen) >= self.until:
            self.enough.set()
        await asyncio.sleep(0)


def _loop(
    redis: aioredis.Redis, keys: RedisKeys, pool: BackendPool, sleep: Pauses
) -> tuple[TakeLoop, list[Taken]]:
    spawned: list[Taken] = []

    def spawn(taken: Taken, _slot: Reservation | None, _local: asyncio.Semaphore | None) -> None:
        spawned.append(taken)

    loop = TakeLoop(
        "small",
        deployments=["m"],
        slots=1,
        worker_id="w1",
        pool=pool,
        lanes=LaneQueue(redis, keys),
        blocking=redis,
        batch_limit=lambda _tier, _keys: -1,
        spawn=spawn,
        sleep=sleep,
    )
    return loop, spawned


def _pool(redis: aioredis.Redis, keys: RedisKeys) -> tuple[BackendPool, str]:
    slot_key = keys.slots("small", "m@a")
    replica = Replica(ScriptedBackend("m@a", []), 1, slot_key=slot_key)
    return BackendPool({"m": [replica]}, leases=SlotLeases(redis)), slot_key


async def _stop(task: asyncio.Task[None]) -> None:
    await stop_task(task)  # redis-py may swallow a first cancel: re-cancelled until done
    assert task.done()


async def _first_pauses(redis: aioredis.Redis, keys: RedisKeys, pool: BackendPool) -> list[float]:
    """The loop's first eight pauses; then it is stopped."""
    pauses = Pauses(until=8)
    loop, _ = _loop(redis, keys, pool, pauses)
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(pauses.enough.wait(), 10)
    await _stop(task)
    return pauses.seen[:8]


async def test_no_free_slot_is_polled_for_with_growing_pauses(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    pool, _ = _pool(redis_conn, keys)
    held = await pool.reserve(["m"])  # the one slot is busy
    assert held is not None
    pauses = await _first_pauses(redis_conn, keys, pool)
    assert pauses == [0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.05]
    await pool.release(held)
    await pool.aclose()


async def test_a_held_slot_is_given_back_when_the_loop_stops(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    pool, slot_key = _pool(redis_conn, keys)
    leases = SlotLeases(redis_conn)
    loop, spawned = _loop(redis_conn, keys, pool, Pauses(until=1))
    task = asyncio.create_task(loop.run())
    for _ in range(200):  # the slot reserved (idle), then the wait on the bell
        if await leases.held_busy([slot_key], IDLE_MARK) == [(1, 0)]:
            break
        await asyncio.sleep(0.01)
    assert await leases.held_busy([slot_key], IDLE_MARK) == [(1, 0)]
    await _stop(task)
    assert await leases.held([slot_key]) == [0]
    assert spawned == []
    await pool.aclose()


async def test_a_failing_redis_is_backed_off_from(key_prefix: str) -> None:
    with socket.socket() as s:  # a port nobody listens on: every command fails to connect
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = aioredis.Redis(port=port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    keys = RedisKeys(key_prefix)
    pool, _ = _pool(dead, keys)
    pauses = await _first_pauses(dead, keys, pool)
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    await dead.aclose()
