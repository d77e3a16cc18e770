"""Redis commands issued within one turn of the event loop go out as one pipeline.

Each round trip to Redis costs the process a write and a read system call, which on a busy
gateway is much of its time per request. The bookkeeping after a request (releasing its slot
lease, publishing its ledger event, acknowledging its job) needs no answer before the next step,
so it goes through a ``Coalescer``: commands queued before the event loop's next turn, from
every request running, are sent together, one pipeline at a time. Under load a pipeline carries
the commands of many requests.

``send`` returns a future for the command's reply; ``send_nowait`` is for commands whose
failure only needs logging. Commands run in the order they were queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from gateway.tasks import stop_task

__all__ = ["Coalescer"]

log = logging.getLogger(__name__)

Command = Callable[[Pipeline], object]
"""Adds one command to a pipeline (e.g. ``lambda p: p.zrem(key, member)``)."""


class Coalescer:
    def __init__(self, redis: aioredis.Redis, *, max_batch: int = 512) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._queued: list[tuple[Command, asyncio.Future[Any] | None, str]] = []
        self._sender: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """Closed: ``send`` and ``send_nowait`` raise ``RuntimeError``."""
        return self._closed

    @property
    def pending(self) -> int:
        """Commands queued and not yet handed to a pipeline."""
        return len(self._queued)

    def send(self, command: Command) -> asyncio.Future[Any]:
        """Queue ``command``; the future gets its reply (or its error)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue(command, future, "")
        return future

    def send_nowait(self, command: Command, what: str) -> None:
        """Queue ``command`` and forget it; a failure is logged with ``what``."""
        self._queue(command, None, what)

    def _queue(self, command: Command, future: asyncio.Future[Any] | None, what: str) -> None:
        if self._closed:
            raise RuntimeError("coalescer closed")
        self._queued.append((command, future, what))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all(), name="tiergate-redis-coalescer")

    async def _send_all(self) -> None:
        while self._queued:
            batch = self._queued[: self._max_batch]
            del self._queued[: self._max_batch]
            await self._send(batch)

    async def _send(self, batch: list[tuple[Command, asyncio.Future[Any] | None, str]]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for command, _future, _what in batch:
                    command(pipe)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            replies = [exc] * len(batch)
        except asyncio.CancelledError:
            for _command, future, _what in batch:
                if future is not None and not future.done():
                    future.cancel()
            raise
        for (_command, future, what), reply in zip(batch, replies, strict=True):
            failed = isinstance(reply, BaseException)
            if future is None:
                if failed:
                    log.warning("redis %s failed: %s", what, type(reply).__name__)
            elif not future.done():
                if failed:
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def flush(self) -> None:
        """Wait until everything queued so far has been sent."""
        while self._sender is not None and not self._sender.done():
            await asyncio.wait({self._sender})

    async def aclose(self) -> None:
        """Send what is queued (within a bound), then refuse new commands."""
        try:
            await asyncio.wait_for(self.flush(), timeout=5.0)
        except TimeoutError:
            log.warning("redis coalescer closed with %d commands unsent", len(self._queued))
        self._closed = True
        await stop_task(self._sender)
