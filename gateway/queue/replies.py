"""The edge's side of the reply channel.

Each edge process owns one reply stream. A single reader task blocks on it and hands every event
to the waiter of its request, so a thousand in-flight requests cost one blocking read, not a
thousand. When Redis cannot be read, every waiter is failed at once (503), never left hanging.

A worker in the edge's own process hands its replies over in memory instead
(``deliver_local``): no stream entry, no read.

Entries are read once, so what was read is trimmed, but at most once a second (``trim_every_s``):
a trim per read would put a Redis command on every reply's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import ServiceUnavailable
from gateway.queue.jobs import Reply
from gateway.queue.streams import stream_entries
from gateway.tasks import stop_task

__all__ = ["ReplyRouter"]

log = logging.getLogger(__name__)

_Item = Reply | BaseException


class ReplyRouter:
    def __init__(
        self,
        redis: aioredis.Redis,
        stream_key: str,
        *,
        block_ms: int = 1000,
        trim_every_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._key = stream_key
        self._block_ms = block_ms
        self._trim_every_s = trim_every_s
        self._trimmed_at = time.monotonic()
        self._waiters: dict[str, asyncio.Queue[_Item]] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_id = b"0-0"
        self.healthy = True

    def register(self, request_id: str) -> asyncio.Queue[_Item]:
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._waiters[request_id] = queue
        return queue

    def unregister(self, request_id: str) -> None:
        self._waiters.pop(request_id, None)

    def deliver_local(self, reply: Reply) -> bool:
        """Hand ``reply`` to its waiter in this process without the reply stream (a worker of
        this process ran the job); ``False`` when no waiter here has its request id."""
        queue = self._waiters.get(reply.request_id)
        if queue is None:
            return False
        queue.put_nowait(reply)
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tiergate-reply-reader")

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(self._key)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                response = await self._redis.xread(
                    {self._key: self._last_id}, count=512, block=self._block_ms
                )
            except (RedisError, OSError) as exc:
                self.healthy = False
                self._fail_all(ServiceUnavailable(f"queue unavailable: {type(exc).__name__}"))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            self.healthy = True
            backoff = 0.05
            entries = stream_entries(response)
            for entry_id, fields in entries:
                self._last_id = entry_id
                self._deliver(fields)
            if entries and time.monotonic() - self._trimmed_at >= self._trim_every_s:
                self._trimmed_at = time.monotonic()
                with contextlib.suppress(RedisError, OSError):
                    await self._redis.xtrim(self._key, minid=self._last_id, approximate=True)

    def _deliver(self, fields: dict[bytes, bytes]) -> None:
        try:
            reply = Reply.from_fields(fields)
        except (KeyError, ValueError) as exc:
            log.error("dropping malformed reply event: %s", exc)
            return
        queue = self._waiters.get(reply.request_id)
        if queue is not None:
            queue.put_nowait(reply)

    def _fail_all(self, error: BaseException) -> None:
        for queue in self._waiters.values():
            queue.put_nowait(error)
