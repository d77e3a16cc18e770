"""Which streams have reached their client: one Redis key per stream, set with its first chunk.

A stream job can run twice: its worker died and another one reclaimed the job. If the first run
had already sent chunks, the client holds part of an answer the second run cannot see, so
starting over would repeat text, a lie. The second run checks the mark and ends the stream with
an explicit error instead. A stream that never reached its client is simply run again (falling
back before the first token is free). Redis errors: a lost mark means a possible repeat, so they
are logged.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

__all__ = ["StreamMarks"]

log = logging.getLogger(__name__)


class StreamMarks:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    def _key(self, request_id: str) -> str:
        return f"{self._prefix}:{{req:{request_id}}}:stream-started"

    async def mark(self, request_id: str, ttl_s: float) -> None:
        try:
            await self._redis.set(self._key(request_id), b"1", ex=max(int(ttl_s), 1))
        except RedisError as exc:
            log.warning("cannot mark stream %s as started: %r", request_id, exc)

    async def started(self, request_id: str) -> bool:
        try:
            return bool(await self._redis.exists(self._key(request_id)))
        except RedisError as exc:
            log.warning("cannot read the stream mark of %s: %r", request_id, exc)
            return False
