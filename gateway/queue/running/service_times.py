"""Each tier's typical job time in this worker: a moving average of how long its jobs take from
start to end. It is published (``RedisKeys.service_time``) for the edges' expected-wait
estimates (``gateway.queue.edge.snapshot``), and the worker leaves a job whose time left is
under it (``too_late``): starting it would hold a slot only to time out while work that can
finish waits (the edge answers it 504 at its deadline; ``gateway.queue.edge.deadline``)."""

from __future__ import annotations

import contextlib
import math
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.queue.jobs import Job
from gateway.queue.keys import RedisKeys

__all__ = ["ServiceTimes"]

_ALPHA = 0.2
_PUBLISH_S = 0.5
"""At most this often a worker publishes a tier's service time (edges read it every 0.5 s)."""


class ServiceTimes:
    __slots__ = ("_keys", "_published", "_redis", "_seconds")

    def __init__(self, redis: aioredis.Redis, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys
        self._seconds: dict[str, float] = {}
        self._published: dict[str, float] = {}

    def too_late(self, tier: str, job: Job) -> bool:
        """Whether the time ``job`` has left is under the tier's typical job time."""
        typical = self._seconds.get(tier)
        return typical is not None and job.deadline - time.time() < typical

    async def note(self, tier: str, seconds: float) -> None:
        """One job of ``tier`` took ``seconds``: the average moves, and is published (at most
        every 0.5 s; a Redis error leaves the last one published)."""
        old = self._seconds.get(tier)
        value = seconds if old is None else old + _ALPHA * (seconds - old)
        self._seconds[tier] = value
        now = time.monotonic()
        if now - self._published.get(tier, -math.inf) < _PUBLISH_S:
            return
        self._published[tier] = now
        with contextlib.suppress(RedisError, OSError):
            await self._redis.set(self._keys.service_time(tier), f"{value:.4f}", ex=3600)
