"""How a running job's replies reach the edge that waits for them.

Three ways, tried in this order: ``deliver`` (a job the edge of this process started at once
hands its replies straight to its waiter), in memory (a job this process's worker runs for this
process's edge, however it got there: ``ReplyRouter.deliver_local``), else the edge's reply
stream in Redis (an ``XADD`` per reply, retried briefly on a passing error). A job's final
reply goes out only once its row is booked and its entry acknowledged (``Worker``): through the
stream, in the same pipeline behind them (``queue``); in memory, right after them. A keyed
job's final reply is kept for its repeats before it goes out (``gateway.limits.idempotency``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError
from tenacity import (
    retry_if_exception_type,
    stop_after_attempt,
    wait_chain,
    wait_fixed,
)

from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.running.executor import Emit
from gateway.retrying import again

__all__ = [
    "AnswerStore",
    "Deliver",
    "EdgeBeside",
    "KeepsNoAnswers",
    "LocalEdge",
    "LocalReplies",
    "NoLocalEdge",
    "ReplySender",
]

log = logging.getLogger(__name__)

_REPLY_MAXLEN = 100_000
_REPLY_RETRY_S = (0.01, 0.05, 0.2)
"""Pauses before sending a reply again: a chunk is not given up on a passing error."""

Deliver = Callable[[Reply], None]
"""Hands a reply of a job started at once to its waiter in this process."""


class LocalReplies(Protocol):
    """The reply channel of the edge in this process (``ReplyRouter``)."""

    def deliver_local(self, reply: Reply) -> bool: ...


class LocalEdge(Protocol):
    """The edge in this process, whose jobs' replies are handed over in memory."""

    def owns(self, job: Job) -> bool:
        """Whether the client of ``job`` waits at this edge."""
        ...

    def deliver_local(self, reply: Reply) -> bool: ...


@dataclass(frozen=True, slots=True)
class EdgeBeside:
    """The ``LocalEdge`` of a process that runs an edge: its id and reply channel."""

    edge_id: str
    replies: LocalReplies

    def owns(self, job: Job) -> bool:
        return job.reply_to == self.edge_id

    def deliver_local(self, reply: Reply) -> bool:
        return self.replies.deliver_local(reply)


class NoLocalEdge:
    """The ``LocalEdge`` of a worker with no edge beside it: no reply is handed over in
    memory (but those of a job started at once, ``Deliver``)."""

    def owns(self, job: Job) -> bool:
        return False

    def deliver_local(self, reply: Reply) -> bool:
        return False


class AnswerStore(Protocol):
    """Keeps a keyed job's final reply for its repeats (``Idempotency``)."""

    async def store(self, tenant: str, key: str, reply: Reply) -> None: ...


class KeepsNoAnswers:
    """The ``AnswerStore`` of a worker whose edges take no idempotency keys."""

    async def store(self, tenant: str, key: str, reply: Reply) -> None:
        return None


class ReplySender:
    """Makes each job's ``emit``. ``local_edge``: the edge in this process, whose jobs'
    replies are handed over in memory rather than through its stream; ``answers``: where a
    keyed job's final reply is kept for its repeats."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        *,
        answers: AnswerStore,
        local_edge: LocalEdge,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._answers = answers
        self._local_edge = local_edge
        self._lost: dict[str, bool] = {}
        """Jobs a chunk of which could not be sent, and whether one had been sent before it:
        their later chunks are dropped (the client gets a prefix of the answer, never one with
        a hole) and their end is an error."""
        self._sent: set[str] = set()
        """Jobs a chunk of which went out through the reply stream."""

    def lost(self, request_id: str) -> bool | None:
        """``None``: every chunk of the request was sent; else whether some reached its edge
        before one was lost. Forgets the request (asked once, at the job's end)."""
        self._sent.discard(request_id)
        return self._lost.pop(request_id, None)

    def through_stream(self, job: Job, deliver: Deliver | None = None) -> str | None:
        """The reply stream the final answer of ``job`` goes to, queued behind its booking
        (``queue``); ``None``: it is handed over in memory (``emitter``), after its booking."""
        if deliver is not None:
            return None
        if self._local_edge.owns(job):
            return None
        return self._keys.replies(job.reply_to)

    @staticmethod
    def queue(pipe: Pipeline, stream: str, reply: Reply) -> None:
        """Queue ``reply`` on ``pipe`` (behind a job's booking and acknowledgement)."""
        pipe.xadd(stream, reply.fields(), maxlen=_REPLY_MAXLEN, approximate=True)

    async def remember(self, job: Job, reply: Reply) -> None:
        """Keep a keyed job's final reply for its repeats, before it goes out."""
        if job.idempotency_key and not job.stream and reply.kind in ("result", "error"):
            await self._remember(job, reply)

    def emitter(self, job: Job, deliver: Deliver | None = None) -> Emit:
        """How the replies of ``job`` reach its edge: ``deliver`` (started at once), in memory
        (its edge is in this process and waits for it), else its edge's reply stream."""
        stream = self._keys.replies(job.reply_to)
        local = self._local_edge if deliver is None and self._local_edge.owns(job) else None

        async def emit(reply: Reply) -> None:
            if reply.kind == "chunk" and job.request_id in self._lost:
                return
            if deliver is not None:
                deliver(reply)
                return
            if local is not None and local.deliver_local(reply):
                return
            await self._send(stream, job, reply)

        return emit

    async def _send(self, stream: str, job: Job, reply: Reply) -> None:
        """One reply on the edge's stream, tried again after each of ``_REPLY_RETRY_S``; Redis
        still failing: the edge waits on (its reads are tried again), and a lost chunk is
        remembered (``lost``). A reply sent at the first try (every chunk of every stream,
        as a rule) pays no tenacity machinery (``gateway.retrying``)."""
        fields = reply.fields()
        try:
            try:
                await self._redis.xadd(stream, fields, maxlen=_REPLY_MAXLEN, approximate=True)
            except (RedisError, OSError) as failed:
                await again(
                    lambda: self._redis.xadd(
                        stream, fields, maxlen=_REPLY_MAXLEN, approximate=True
                    ),
                    failed,
                    retry=retry_if_exception_type((RedisError, OSError)),
                    stop=stop_after_attempt(len(_REPLY_RETRY_S) + 1),
                    wait=wait_chain(*(wait_fixed(pause) for pause in _REPLY_RETRY_S)),
                )
        except (RedisError, OSError) as exc:
            log.warning("cannot reply for %s: %s", job.request_id, type(exc).__name__)
            if reply.kind == "chunk":
                self._lost[job.request_id] = job.request_id in self._sent
            return
        if reply.kind == "chunk":
            self._sent.add(job.request_id)

    async def _remember(self, job: Job, reply: Reply) -> None:
        """Keep a keyed job's final reply for its repeats (before the reply goes out)."""
        if job.idempotency_key is None:
            return
        try:
            await self._answers.store(job.tenant, job.idempotency_key, reply)
        except (RedisError, OSError) as exc:
            log.warning("cannot keep the answer of %s: %s", job.request_id, type(exc).__name__)
