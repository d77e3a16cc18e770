"""The edge's side of the reply channel.

Each edge process owns one reply stream. A single reader task blocks on it and hands every event
to the waiter of its request, so a thousand in-flight requests cost one blocking read, not a
thousand. When Redis cannot be read, the reader tries again (backing off, up to a second) and
goes on from the last entry it read; its waiters keep waiting. A waiter's job is in Redis and
may be running: answering it 503 would not stop the job, which would run and be booked for a
client told it failed. Each waiter ends as it always does — with its answer, or at its deadline
(``Dispatcher``), when the edge takes its claim or answers 504.

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
from tenacity import wait_exponential

from gateway.loops import Loop
from gateway.queue.client.connection import BLOCKING_READ_S
from gateway.queue.client.streams import stream_entries
from gateway.queue.jobs import Reply

__all__ = ["ReplyRouter"]

log = logging.getLogger(__name__)

_Item = Reply | BaseException


class ReplyRouter:
    def __init__(
        self,
        redis: aioredis.Redis,
        stream_key: str,
        *,
        block_ms: int = round(BLOCKING_READ_S * 1000),
        trim_every_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._key = stream_key
        self._block_ms = block_ms
        self._trim_every_s = trim_every_s
        self._trimmed_at = time.monotonic()
        self._waiters: dict[str, asyncio.Queue[_Item]] = {}
        self._reader = Loop(  # blocks on the stream itself: no pause between reads
            "tiergate-reply-reader",
            self._read,
            every_s=0,
            catch=(RedisError, OSError),
            on_error=self._unreadable,
            backoff=wait_exponential(multiplier=0.05, max=1.0),
        )
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
        self._reader.start()

    async def aclose(self) -> None:
        await self._reader.aclose()
        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(self._key)

    async def _read(self) -> None:
        response = await self._redis.xread(
            {self._key: self._last_id}, count=512, block=self._block_ms
        )
        self.healthy = True
        entries = stream_entries(response)
        for entry_id, fields in entries:
            self._last_id = entry_id
            self._deliver(fields)
        if entries and time.monotonic() - self._trimmed_at >= self._trim_every_s:
            self._trimmed_at = time.monotonic()
            with contextlib.suppress(RedisError, OSError):
                await self._redis.xtrim(self._key, minid=self._last_id, approximate=True)

    def _unreadable(self, exc: BaseException) -> None:
        """Read again after a pause growing to a second; the waiters keep waiting."""
        if self.healthy:
            log.warning("reply stream unreadable (%s); reading again", type(exc).__name__)
        self.healthy = False

    def _deliver(self, fields: dict[bytes, bytes]) -> None:
        try:
            reply = Reply.from_fields(fields)
        except (KeyError, ValueError) as exc:
            log.error("dropping malformed reply event: %s", exc)
            return
        queue = self._waiters.get(reply.request_id)
        if queue is not None:
            queue.put_nowait(reply)
