"""Cancels: what an edge publishes when a job's client leaves and a worker owns the job
(``RedisKeys.cancels``, every worker listens), and the ones heard before their job runs here.

An edge publishes a cancel once its own claim on the job fails, that is once a worker's claim
has won in Redis. The message can reach a worker's event loop before that worker's task has
seen its claim's reply and registered the job as running; ``EarlyCancels`` keeps such ids, so
the job, when it starts, ends at once as ``client_disconnected`` instead of running in full for
a client that has gone. Request ids are unique, so an id kept too long matches nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from tenacity import wait_exponential

from gateway.loops import Loop, Sleep
from gateway.queue.client.connection import BLOCKING_READ_S

__all__ = ["CancelListener", "EarlyCancels"]

log = logging.getLogger(__name__)


class EarlyCancels:
    """The last ``keep`` cancels that named no job running here (insertion order, oldest
    dropped first: every worker hears every edge's cancels, most for jobs of other workers)."""

    __slots__ = ("_ids", "_keep")

    def __init__(self, *, keep: int = 4096) -> None:
        self._ids: dict[str, None] = {}
        self._keep = keep

    def hear(self, request_id: str) -> None:
        self._ids[request_id] = None
        if len(self._ids) > self._keep:
            del self._ids[next(iter(self._ids))]

    def take(self, request_id: str) -> bool:
        """Whether a cancel for ``request_id`` was heard (forgotten now)."""
        if request_id in self._ids:
            del self._ids[request_id]
            return True
        return False


class CancelListener:
    """Calls ``cancel(request_id)`` for each cancel published on ``channel``, from ``start``
    until ``aclose``. A lost subscription is made again (a ``Loop`` with a tenacity backoff:
    0.1 s, doubling up to 2 s, starting over once a read succeeds)."""

    __slots__ = ("_cancel", "_channel", "_loop", "_pubsub", "_redis")

    def __init__(
        self,
        redis: aioredis.Redis,
        channel: str,
        cancel: Callable[[str], object],
        *,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._redis = redis
        self._channel = channel
        self._cancel = cancel
        self._pubsub: PubSub | None = None
        self._loop = Loop(  # each step blocks on the subscription itself: no pause between
            "tiergate-cancels",
            self._hear,
            every_s=0,
            catch=(RedisError, OSError),
            on_error=_unheard,
            backoff=wait_exponential(multiplier=0.1, max=2.0),
            sleep=sleep,
        )

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()
        await self._unsubscribe()

    async def _hear(self) -> None:
        """One read of the subscription (made first if there is none); a failed one is
        closed, and the next step subscribes again."""
        try:
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                await self._pubsub.subscribe(self._channel)
            message = await self._pubsub.get_message(timeout=BLOCKING_READ_S)
        except (RedisError, OSError):
            await self._unsubscribe()
            raise
        if message is not None and isinstance(message.get("data"), bytes):
            self._cancel(message["data"].decode())

    async def _unsubscribe(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]


def _unheard(exc: BaseException) -> None:
    log.warning("worker cannot hear cancels: %s", type(exc).__name__)
