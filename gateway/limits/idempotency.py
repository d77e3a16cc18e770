"""Idempotency keys: a repeated non-streamed request (same tenant, same ``idempotency-key``) runs
once; the repeat waits for the first one's answer and gets the same body.

``<p>:{idem:<tenant>}:<key>`` holds the request id of the first request (``SET NX``), and
``…:result`` its final reply once its worker has one; both expire after ``ttl_s``. The repeat is
never queued, so the backend is called once and the ledger has the first request's row only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.errors import DeadlineExceeded
from gateway.queue.jobs import Reply

__all__ = ["Idempotency"]

_POLL_S = 0.02


class Idempotency:
    def __init__(self, redis: aioredis.Redis, prefix: str, *, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_s = ttl_s

    def _key(self, tenant: str, key: str) -> str:
        return f"{self._prefix}:{{idem:{tenant}}}:{key}"

    async def claim(self, tenant: str, key: str, request_id: str) -> str | None:
        """``None`` when this request is the first with ``key``; else the first one's id."""
        name = self._key(tenant, key)
        if await self._redis.set(name, request_id, nx=True, ex=self._ttl_s):
            return None
        first: Any = await self._redis.get(name)
        return first.decode() if isinstance(first, bytes) else str(first)

    async def store(self, tenant: str, key: str, reply: Reply) -> None:
        payload = orjson.dumps(
            {"r": reply.request_id, "k": reply.kind, "d": reply.data, "m": reply.meta}
        )
        await self._redis.set(self._key(tenant, key) + ":result", payload, ex=self._ttl_s)

    async def wait(self, tenant: str, key: str, deadline: float) -> Reply:
        """The first request's final reply, once there; ``DeadlineExceeded`` at ``deadline``."""
        name = self._key(tenant, key) + ":result"
        while True:
            raw: Any = await self._redis.get(name)
            if raw is not None:
                data = orjson.loads(raw)
                return Reply(data["r"], data["k"], data["d"], data["m"])
            if time.time() >= deadline:
                raise DeadlineExceeded("the first request with this idempotency key did not finish")
            await asyncio.sleep(_POLL_S)
