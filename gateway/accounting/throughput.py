"""Measured throughput of self-hosted pools, shared by every process through Redis.

Each completed request adds its tokens (prompt + completion, per attempt) to a per-deployment
counter for the current ``bucket_s``-second bucket; a pool's throughput is the tokens of the
buckets inside the last ``window_s`` seconds divided by the time they span (from the start of the
oldest non-empty bucket to now, at least one bucket, so a pool that started a minute ago is not
diluted over the whole window). Buckets expire on their own.

Keys: ``{prefix}:{gpu:<deployment>}:tok:<bucket number>``; one deployment's keys share a hash tag.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping

import redis.asyncio as aioredis

__all__ = ["ThroughputMeter"]


class ThroughputMeter:
    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        window_s: int = 300,
        bucket_s: int = 10,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if window_s < bucket_s or bucket_s < 1:
            raise ValueError("need window_s >= bucket_s >= 1")
        self._redis = redis
        self._prefix = prefix
        self._window_s = window_s
        self._bucket_s = bucket_s
        self._clock = clock

    def key(self, deployment: str, bucket: int) -> str:
        return f"{self._prefix}:{{gpu:{deployment}}}:tok:{bucket}"

    async def record(self, tokens: Mapping[str, int]) -> None:
        """Add ``tokens`` per deployment to the current bucket."""
        bucket = math.floor(self._clock() / self._bucket_s)
        ttl = self._window_s + 2 * self._bucket_s
        async with self._redis.pipeline(transaction=False) as pipe:
            for deployment, n in tokens.items():
                if n > 0:
                    key = self.key(deployment, bucket)
                    pipe.incrby(key, n)
                    pipe.expire(key, ttl)
            await pipe.execute()

    async def tokens_per_s(self, deployments: Iterable[str]) -> dict[str, float | None]:
        """Each deployment's throughput over the window; ``None`` with no tokens in it."""
        now = self._clock()
        last = math.floor(now / self._bucket_s)
        buckets = list(range(last - self._window_s // self._bucket_s + 1, last + 1))
        names = list(dict.fromkeys(deployments))
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.mget([self.key(name, b) for b in buckets])
            replies = await pipe.execute()
        rates: dict[str, float | None] = {}
        for name, values in zip(names, replies, strict=True):
            counts = [int(v) if v is not None else 0 for v in values]
            total = sum(counts)
            if total == 0:
                rates[name] = None
                continue
            first = buckets[next(i for i, c in enumerate(counts) if c)]
            span = max(now - first * self._bucket_s, float(self._bucket_s))
            rates[name] = total / span
        return rates
