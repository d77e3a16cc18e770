"""Redis commands issued within one turn of the event loop go out as one pipeline.

Each round trip to Redis costs the process a write and a read system call, which on a busy
gateway is much of its time per request. The bookkeeping after a request (releasing its slot
lease, publishing its ledger event, acknowledging its job) needs no answer before the next step,
so it goes through a ``Coalescer``: commands queued before the event loop's next turn, from
every request running, are sent together, one pipeline at a time. Under load a pipeline carries
the commands of many requests.

``send`` returns a future for the command's reply; ``send_nowait`` is for commands whose
failure only needs logging. Commands run in the order they were queued.

One entry, one set of replies: an entry is a function that adds commands to the pipeline, and
the coalescer counts what each one added, so every entry gets exactly the replies of its own
commands, however many the entries before it added. A ``send`` entry must add exactly one
command (its future gets that command's reply; any other count fails that future alone with
``ValueError``); a ``send_nowait`` entry may add several (a stream's mark with the run's note),
each failure logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.tasks import stop_task

__all__ = ["Coalescer", "Command", "CommandQueue", "NoCoalescer", "Pipelines"]

log = logging.getLogger(__name__)

Command = Callable[[Pipeline], object]
"""Adds commands to a pipeline (e.g. ``lambda p: p.zrem(key, member)``): exactly one for
``send``, any number for ``send_nowait``."""

_Entry = tuple[Command, asyncio.Future[Any] | None, str]


class Pipelines(Protocol):
    """What the coalescer needs of its Redis client (``redis.asyncio.Redis``)."""

    def pipeline(self, transaction: bool = True) -> Pipeline: ...


class CommandQueue(Protocol):
    """Where commands are queued to share a pipeline with others (``Coalescer``). A user
    sends a command itself while ``closed``."""

    @property
    def closed(self) -> bool: ...

    def send(self, command: Command) -> asyncio.Future[Any]: ...

    def send_nowait(self, command: Command, what: str) -> None: ...


class NoCoalescer:
    """The ``CommandQueue`` of a part that coalesces nothing: always closed, so each user
    sends its commands itself (a round trip each)."""

    @property
    def closed(self) -> bool:
        return True

    def send(self, command: Command) -> asyncio.Future[Any]:
        raise RuntimeError("no coalescer")

    def send_nowait(self, command: Command, what: str) -> None:
        raise RuntimeError("no coalescer")


class Coalescer:
    def __init__(self, redis: Pipelines, *, max_batch: int = 512) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._queued: list[_Entry] = []
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

    async def _send(self, batch: list[_Entry]) -> None:
        counts: list[int] = []
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for command, _future, _what in batch:
                    before = len(pipe)
                    command(pipe)
                    counts.append(len(pipe) - before)
                replies: list[Any] = await pipe.execute(raise_on_error=False) if len(pipe) else []
        except (RedisError, OSError) as exc:
            for _command, future, what in batch:
                self._settle(future, what, [exc])
            return
        except asyncio.CancelledError:
            for _command, future, _what in batch:
                if future is not None and not future.done():
                    future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - a sender that dies would leave its futures unsettled
            # Anything else (uvloop's RuntimeError on a transport closed under a dying node, an
            # entry that raises) fails the batch as a lost connection: its callers handle that,
            # and not one of them waits forever on a future nobody settles.
            log.warning("redis pipeline failed: %s: %s", type(exc).__name__, exc)
            lost = RedisConnectionError(f"pipeline failed: {type(exc).__name__}")
            lost.__cause__ = exc
            for _command, future, what in batch:
                self._settle(future, what, [lost])
            return
        at = 0
        for (_command, future, what), count in zip(batch, counts, strict=True):
            self._settle(future, what, replies[at : at + count])
            at += count

    @staticmethod
    def _settle(future: asyncio.Future[Any] | None, what: str, replies: list[Any]) -> None:
        """Hand one entry its own replies."""
        if future is None:
            for reply in replies:
                if isinstance(reply, BaseException):
                    log.warning("redis %s failed: %s", what, type(reply).__name__)
            return
        if future.done():
            return
        if len(replies) != 1:
            future.set_exception(
                ValueError(f"a send entry must add one command to the pipeline, not {len(replies)}")
            )
        elif isinstance(replies[0], BaseException):
            future.set_exception(replies[0])
        else:
            future.set_result(replies[0])

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
