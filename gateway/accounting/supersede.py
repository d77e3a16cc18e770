"""A provisional ledger row, and the run's entry that replaces its bookkeeping.

The edge answers a job a worker had started 504 when no answer came by the deadline plus a
grace (``gateway.queue.edge.dispatcher``), and books that answer itself: no attempts, no tokens, $0.
The job may still be running, or be taken over by another worker (its worker died, or handed it
back at shutdown), and that run books the calls the provider bills. With first-wins idempotency
the edge's empty row would hide them, so the edge marks its row *provisional*, and the first
entry a run writes for the same request id replaces the row's bookkeeping — once — while the row
keeps what the client was told.

Which field comes from which:

- **the client's** (kept from the provisional row): request id, tenant, principal,
  ``created_at``, ``outcome`` and ``status_code`` (the 504 ``timeout`` the client received),
  requested model, rule, score, ``stream``, ``latency_ms`` and ``ttft_ms`` (how long the
  client waited, and that no first token reached it);
- **the run's** (``BOOKED_FIELDS``, from the run's entry): tier and deployment, app and tags
  (the edge's row has neither; budgets and reports group by them), tokens, cost, baseline,
  ``price_known``, ``queue_ms``, attempts, idempotency key, the estimated part of the cost.

The two may arrive in either order: a run books before it answers, so its entry can be in the
ledger when its answer reaches an edge that had already given up (a worker cancelled at
shutdown, a reply delayed past the grace). Whenever the edge booked a provisional row, its
client got the edge's answer, so the row is the same either way: the client's part from the
provisional entry, the bookkeeping from the run's. The replaced row is no longer provisional
and carries ``superseded_at``; it is not replaced again (an event the sink delivers twice is
booked once). Every other row is final: first wins. The SQL upsert (``SqlLedger``) and ``fold``
(a batch that holds both entries of one id) apply the same rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime

from gateway.accounting.records import LedgerEntry

__all__ = ["BOOKED_FIELDS", "CLIENT_FIELDS", "answers", "fold", "replaces", "superseded"]

BOOKED_FIELDS = (
    "tier",
    "deployment",
    "app",
    "tags",
    "prompt_tokens",
    "completion_tokens",
    "cost_micro_usd",
    "baseline_micro_usd",
    "price_known",
    "queue_ms",
    "attempts",
    "idempotency_key",
    "estimated_micro_usd",
    "cost_nano_usd",
    "baseline_nano_usd",
    "price_source",
)
"""The columns a run's entry replaces in a provisional row (the bookkeeping)."""

CLIENT_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(LedgerEntry)
    if f.name not in (*BOOKED_FIELDS, "request_id", "provisional", "superseded_at")
)
"""The columns the client's answer sets (kept from, or taken from, the provisional entry)."""


def replaces(booked: LedgerEntry, new: LedgerEntry) -> bool:
    """Whether ``new`` replaces what ``booked`` books: only a run's entry over a provisional
    row that was never replaced."""
    return booked.provisional and not new.provisional


def answers(booked: LedgerEntry, new: LedgerEntry) -> bool:
    """Whether ``new`` (the edge's provisional answer) gives ``booked`` (a run's entry that
    came first, never folded with a provisional one) the client's part."""
    return new.provisional and not booked.provisional and booked.superseded_at is None


def superseded(provisional: LedgerEntry, run: LedgerEntry, at: datetime) -> LedgerEntry:
    """``provisional`` with the bookkeeping of ``run``: what the ledger holds once replaced."""
    booked = {name: getattr(run, name) for name in BOOKED_FIELDS}
    return dataclasses.replace(provisional, **booked, provisional=False, superseded_at=at)


def fold(entries: Iterable[LedgerEntry], at: datetime) -> list[LedgerEntry]:
    """One entry per request id, in first-seen order, as booking ``entries`` one by one would
    leave it: the first wins, except that a provisional entry and a run's are joined whichever
    came first. (One SQL statement must not touch a row twice, so a batch is folded before it
    is written.)"""
    out: dict[str, LedgerEntry] = {}
    for entry in entries:
        first = out.get(entry.request_id)
        if first is None:
            out[entry.request_id] = entry
        elif replaces(first, entry):
            out[entry.request_id] = superseded(first, entry, at)
        elif answers(first, entry):
            out[entry.request_id] = superseded(entry, first, at)
    return list(out.values())
