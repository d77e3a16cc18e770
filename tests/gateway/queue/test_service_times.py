"""A tier's typical job time in a worker: a moving average of its jobs' times, published to
Redis for the edges (at most every 0.5 s), and the bar under which a job's time left is too
short to start it."""

from __future__ import annotations

import dataclasses
import time

import redis.asyncio as aioredis

from gateway.queue.jobs import Job
from gateway.queue.keys import RedisKeys
from gateway.queue.running.service_times import ServiceTimes
from tests.gateway.queue.conftest import plan_job


def _left(seconds: float) -> Job:
    return dataclasses.replace(plan_job("m"), deadline=time.time() + seconds)


async def test_no_job_is_too_late_before_one_has_finished(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    times = ServiceTimes(redis_conn, RedisKeys(key_prefix))
    assert not times.too_late("small", _left(0.01))


async def test_a_job_with_less_time_left_than_the_average_is_too_late(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    times = ServiceTimes(redis_conn, keys)
    await times.note("small", 4.0)
    assert await redis_conn.get(keys.service_time("small")) == b"4.0000"
    await times.note("small", 9.0)  # 4 + 0.2 x (9 - 4) = 5: within 0.5 s, not published
    assert await redis_conn.get(keys.service_time("small")) == b"4.0000"
    assert times.too_late("small", _left(4.5))
    assert not times.too_late("small", _left(5.5))
    assert not times.too_late("large", _left(0.5))  # each tier its own
