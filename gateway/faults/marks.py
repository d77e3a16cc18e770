"""Which streams have reached their client: one Redis key per stream, set with its first chunk.

A stream job can run twice: its worker died and another one reclaimed the job. If the first run
had already sent chunks, the client holds part of an answer the second run cannot see, so
starting over would repeat text, a lie. The second run checks the mark and ends the stream with
an explicit error instead. A stream that never reached its client is simply run again (falling
back before the first token is free). Redis errors: a lost mark means a possible repeat, so they
are logged.

Only a reclaimed job can have run before (a job read from its stream for the first time, or
started at once, cannot), so only a reclaimed run reads the mark. The mark is awaited before the
first chunk leaves for an edge in another process; when the edge is in this process it is
queued on the coalescer (``wait=False``) after the chunk is handed over: the client's connection
lives in this process, so if it dies before the mark is written there is no client left to
repeat text to (the reclaimed run is then run again and booked, not booked as broken).

A mark can carry another command in its round trip (``also``): the run's note of its calls
(``gateway.queue.ownership.notes``), which the stream's first chunk updates at no cost of its own.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from gateway.coalescer import Coalescer, Command
from gateway.queue.keys import RedisKeys

__all__ = ["NoStreamMarks", "StreamMarker", "StreamMarks"]

log = logging.getLogger(__name__)


class StreamMarker(Protocol):
    """Marks a stream as started, for a run that takes its job over (``StreamMarks``)."""

    async def mark(
        self, request_id: str, ttl_s: float, *, wait: bool = True, also: Command | None = None
    ) -> None: ...

    async def started(self, request_id: str) -> bool: ...


class NoStreamMarks:
    """The ``StreamMarker`` that marks nothing: a reclaimed stream is never known to have
    started, and is run again from the start."""

    async def mark(
        self, request_id: str, ttl_s: float, *, wait: bool = True, also: Command | None = None
    ) -> None:
        return None

    async def started(self, request_id: str) -> bool:
        return False


class StreamMarks:
    def __init__(
        self, redis: aioredis.Redis, prefix: str, *, coalescer: Coalescer | None = None
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._redis_keys = RedisKeys(prefix)
        self._coalescer = coalescer

    def _key(self, request_id: str) -> str:
        return self._redis_keys.stream_mark(request_id)

    async def mark(
        self, request_id: str, ttl_s: float, *, wait: bool = True, also: Command | None = None
    ) -> None:
        """Set the mark; ``wait=False`` queues it on the coalescer (if there is one) and
        returns at once. ``also``: a command sent with it (in one pipeline: no round trip of
        its own), before it."""
        key, ex = self._key(request_id), max(int(ttl_s), 1)

        def commands(pipe: Pipeline) -> None:
            if also is not None:
                also(pipe)
            pipe.set(key, b"1", ex=ex)

        if not wait and self._coalescer is not None and not self._coalescer.closed:
            self._coalescer.send_nowait(commands, f"stream mark of {request_id}")
            return
        try:
            if also is None:
                await self._redis.set(key, b"1", ex=ex)
                return
            async with self._redis.pipeline(transaction=False) as pipe:
                commands(pipe)
                await pipe.execute()
        except RedisError as exc:
            log.warning("cannot mark stream %s as started: %r", request_id, exc)

    async def started(self, request_id: str) -> bool:
        try:
            return bool(await self._redis.exists(self._key(request_id)))
        except RedisError as exc:
            log.warning("cannot read the stream mark of %s: %r", request_id, exc)
            return False
