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
from redis.exceptions import RedisError

from gateway.queue.client.connection import BLOCKING_READ_S

__all__ = ["EarlyCancels", "hear_cancels"]

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


async def hear_cancels(
    redis: aioredis.Redis,
    channel: str,
    cancel: Callable[[str], object],
    running: Callable[[], bool],
) -> None:
    """Call ``cancel(request_id)`` for each cancel published on ``channel`` while
    ``running()``; a lost subscription is made again (backing off up to 2 s)."""
    backoff = 0.1
    while running():
        pubsub = redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            backoff = 0.1
            while running():
                message = await pubsub.get_message(timeout=BLOCKING_READ_S)
                if message is not None and isinstance(message.get("data"), bytes):
                    cancel(message["data"].decode())
        except (RedisError, OSError) as exc:
            log.warning("worker cannot hear cancels: %s", type(exc).__name__)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
