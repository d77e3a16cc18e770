"""Ledger entries as events on a Redis stream (JSON, money as integer micro-dollars); also how
``tiergate ledger show`` prints a row. Every field of ``LedgerEntry`` goes through
(``gateway.codec``); on the stream the fields added after the first writers are written only
when set, while a row shown to a reader (``row_values``) has every column."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from gateway.accounting.records import Attempt, LedgerEntry
from gateway.codec import ISO_TIME, RecordCodec

__all__ = ["decode_entry", "encode_entry", "row_values"]

_CONVERTERS = {datetime: ISO_TIME, Attempt: (Attempt.to_dict, Attempt.from_dict)}

_EVENT = RecordCodec(
    LedgerEntry,
    _CONVERTERS,
    # absent from events of older writers, and from most rows: only written when set
    omit_when_default=frozenset(
        {
            "idempotency_key",
            "estimated_micro_usd",
            "provisional",
            "superseded_at",  # set by the ledger: a row read back (``ledger show``)
            "cost_nano_usd",  # since 0008, like the two below
            "baseline_nano_usd",
            "price_source",
            "endpoint",  # since 0009: absent, a chat request's
        }
    ),
)


def encode_entry(entry: LedgerEntry) -> bytes:
    return orjson.dumps(_EVENT.to_values(entry))


_ROW = RecordCodec(LedgerEntry, _CONVERTERS)


def row_values(entry: LedgerEntry) -> dict[str, Any]:
    """Every column of ``entry``, defaults included, in JSON-ready form: what finance reads."""
    return _ROW.to_values(entry)


def decode_entry(raw: bytes) -> LedgerEntry:
    return _EVENT.from_values(orjson.loads(raw))
