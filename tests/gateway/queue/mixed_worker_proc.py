"""A worker process for the crash tests of run notes: ``python -m
tests.gateway.queue.mixed_worker_proc REDIS_URL PREFIX VLLM_URL HOSTED_URL NAME``; serves the
``small`` and ``external`` tiers (``tests.gateway.queue.mixed``), prints ``ready`` once it takes
work, then runs until killed. It books into nothing: it is killed before it could."""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import Collect
from tests.gateway.queue.mixed import start_mixed_node


async def main(redis_url: str, prefix: str, vllm_url: str, hosted_url: str, name: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    await start_mixed_node(
        redis, RedisKeys(prefix), vllm_url, hosted_url, Collect(), name, lease_ms=2000
    )
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
