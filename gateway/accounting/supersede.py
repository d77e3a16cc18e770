"""A provisional ledger row, and the run's entry that replaces its bookkeeping.

The edge answers a job a worker had started 504 when no answer came by the deadline plus a
grace (``gateway.queue.dispatcher``), and books that answer itself: no attempts, no tokens, $0.
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

The replaced row is no longer provisional and carries ``superseded_at``. Every other row is
final: a provisional entry never replaces anything (a run's row that came first stays), and a
replaced row is not replaced again (an event the sink delivers twice is booked once). The SQL
upsert (``SqlLedger``) and ``fold`` (a batch that holds both entries of one id) apply the same
rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime

from gateway.accounting.records import LedgerEntry

__all__ = ["BOOKED_FIELDS", "fold", "replaces", "superseded"]

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
)
"""The columns a run's entry replaces in a provisional row (the bookkeeping)."""


def replaces(booked: LedgerEntry, new: LedgerEntry) -> bool:
    """Whether ``new`` replaces what ``booked`` books: only a run's entry over a provisional
    row that was never replaced."""
    return booked.provisional and not new.provisional


def superseded(provisional: LedgerEntry, run: LedgerEntry, at: datetime) -> LedgerEntry:
    """``provisional`` with the bookkeeping of ``run``: what the ledger holds once replaced."""
    booked = {name: getattr(run, name) for name in BOOKED_FIELDS}
    return dataclasses.replace(provisional, **booked, provisional=False, superseded_at=at)


def fold(entries: Iterable[LedgerEntry], at: datetime) -> list[LedgerEntry]:
    """One entry per request id, in first-seen order, as booking ``entries`` one by one would
    leave it: the first wins, unless it is provisional and a run's entry follows. (One SQL
    statement must not touch a row twice, so a batch is folded before it is written.)"""
    out: dict[str, LedgerEntry] = {}
    for entry in entries:
        first = out.get(entry.request_id)
        if first is None:
            out[entry.request_id] = entry
        elif replaces(first, entry):
            out[entry.request_id] = superseded(first, entry, at)
    return list(out.values())
