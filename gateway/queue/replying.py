"""How a running job's replies reach the edge that waits for them.

Three ways, tried in this order: ``deliver`` (a job the edge of this process started at once
hands its replies straight to its waiter), in memory (a job this process's worker runs for this
process's edge, however it got there: ``ReplyRouter.deliver_local``), else the edge's reply
stream in Redis (an ``XADD`` per reply, retried briefly on a passing error). A keyed job's final
reply is kept for its repeats before it goes out (``gateway.limits.idempotency``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.limits.idempotency import Idempotency
from gateway.queue.executor import Emit
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys

__all__ = ["Deliver", "LocalReplies", "ReplySender"]

log = logging.getLogger(__name__)

_REPLY_MAXLEN = 100_000
_REPLY_RETRY_S = (0.01, 0.05, 0.2)
"""Pauses before sending a reply again: a chunk is not given up on a passing error."""

Deliver = Callable[[Reply], None]
"""Hands a reply of a job started at once to its waiter in this process."""


class LocalReplies(Protocol):
    """The reply channel of the edge in this process (``ReplyRouter``)."""

    def deliver_local(self, reply: Reply) -> bool: ...


class ReplySender:
    """Makes each job's ``emit``. ``local_edge``: the id and reply channel of the edge in this
    process, whose jobs' replies are handed over in memory rather than through its stream."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        *,
        idempotency: Idempotency | None = None,
        local_edge: tuple[str, LocalReplies] | None = None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._idempotency = idempotency
        self._local_edge = local_edge

    def emitter(self, job: Job, deliver: Deliver | None = None) -> Emit:
        """How the replies of ``job`` reach its edge: ``deliver`` (started at once), in memory
        (its edge is in this process and waits for it), else its edge's reply stream."""
        stream = self._keys.replies(job.reply_to)
        local = None
        if deliver is None and self._local_edge is not None:
            edge_id, replies = self._local_edge
            local = replies if job.reply_to == edge_id else None

        async def emit(reply: Reply) -> None:
            if job.idempotency_key and not job.stream and reply.kind in ("result", "error"):
                await self._remember(job, reply)
            if deliver is not None:
                deliver(reply)
                return
            if local is not None and local.deliver_local(reply):
                return
            await self._send(stream, job, reply)

        return emit

    async def _send(self, stream: str, job: Job, reply: Reply) -> None:
        fields = reply.fields()
        for pause in (*_REPLY_RETRY_S, None):
            try:
                await self._redis.xadd(stream, fields, maxlen=_REPLY_MAXLEN, approximate=True)
                return
            except (RedisError, OSError) as exc:
                if pause is None:
                    # Redis is gone: the edge fails its waiters (503) on its own reads.
                    log.warning("cannot reply for %s: %s", job.request_id, type(exc).__name__)
                    return
                await asyncio.sleep(pause)

    async def _remember(self, job: Job, reply: Reply) -> None:
        """Keep a keyed job's final reply for its repeats (before the reply goes out)."""
        if self._idempotency is None or job.idempotency_key is None:
            return
        try:
            await self._idempotency.store(job.tenant, job.idempotency_key, reply)
        except (RedisError, OSError) as exc:
            log.warning("cannot keep the answer of %s: %s", job.request_id, type(exc).__name__)
