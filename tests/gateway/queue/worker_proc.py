"""A worker process for the crash tests: ``python -m tests.gateway.queue.worker_proc REDIS_URL
PREFIX SIM_URL NAME``; prints ``ready`` once it takes work, then runs until killed."""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import Collect, CountingSim, start_node


async def main(redis_url: str, prefix: str, sim_url: str, name: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    sim = CountingSim(url=sim_url, capacity=2)
    await start_node(
        redis, RedisKeys(prefix), [sim], Collect(), name, lease_ms=2000,
        reclaim_idle_s=1.5, heartbeat_s=0.3,
    )  # fmt: skip
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
