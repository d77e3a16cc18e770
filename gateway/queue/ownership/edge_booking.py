"""The edge books what a handed-back job's runs noted, when it takes the job's claim.

A worker that hands a job back at shutdown notes its calls (``gateway.queue.ownership.notes``) and
releases the job's claim; the worker that takes the job over books them in its row. But the
edge may take the released claim first (``SET NX``, ``Dispatcher``): its client went away
(``Dispatcher.abandon``, streamed or not), or its deadline passed. Then no run can start any
more, nothing can add a call, and the note — read in the claim's round trip — is the whole story.
So the edge books the request's one row from it at once: final, the noted calls (as a run that
took the job over would book them: ``Billing.noted``) under the answer the edge gave (499
``client_disconnected`` or 504 ``timeout``), the budget settled at their cost. It relies on no
worker coming back.

The note is deleted once the row is written. A worker that finds the job later (the claim is
the edge's) then has nothing to book and drops it; a note still there ``EDGE_BOOKING_GRACE_S``
after the worker first saw it means the edge could not book (its process stopped between), and
that worker books it (``Executor.noted``) under its best guess of the answer (504 past the
deadline, else 499). The grace matters: the ledger keeps a request's first entry, and a worker
booking at once could win over the edge's row with a wrong answer (the edge's 503 at shutdown).
A worker that reads the note just before the edge deletes it books the same calls a second time
in vain, and a budget settles once per request id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.writer import LedgerWriter
from gateway.errors import GatewayError
from gateway.queue.billing import Billing
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.notes import RunNote

__all__ = ["EDGE_BOOKING_GRACE_S", "NotedBooking"]

log = logging.getLogger(__name__)

EDGE_BOOKING_GRACE_S = 2.0
"""How long a worker leaves a note it found under the edge's claim to that edge, which books it
in milliseconds unless its process stopped."""


class NotedBooking:
    """Books, for the edge that took a handed-back job's claim, the calls its runs noted."""

    def __init__(
        self, redis: aioredis.Redis, keys: RedisKeys, billing: Billing, ledger: LedgerWriter
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._billing = billing
        self._ledger = ledger

    async def book(
        self, job: Job, note: RunNote, answer: GatewayError, *, provisional: bool = False
    ) -> Reply:
        """Book ``job`` answered ``answer``, with the calls of ``note``; the error reply its
        client gets (with the cost, as a worker's reply carries it). A row that cannot be
        written anywhere is logged, and its note kept for the worker that finds the job.
        ``provisional``: a run still holds the job (the edge stopped waiting for it at
        shutdown); its entry replaces this row's bookkeeping, and its note is left to it."""
        entry, meta = self._billing.noted(job, note, answer)
        if provisional:
            entry = dataclasses.replace(entry, provisional=True)
        try:
            await self._ledger.write(entry)
        except (RedisError, SQLAlchemyError, OSError) as exc:
            log.error("could not book the calls noted for %s: %r", job.request_id, exc)
        else:
            if not provisional:
                with contextlib.suppress(RedisError, OSError):  # left: booked again, in vain
                    await self._redis.delete(self._keys.run_note(job.request_id))
        return Reply.failed(job.request_id, answer, meta)
