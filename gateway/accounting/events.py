"""Ledger entries as events on a Redis stream (JSON, money as integer micro-dollars); also how
``tiergate ledger show`` prints a row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from gateway.accounting.records import Attempt, LedgerEntry

__all__ = ["decode_entry", "encode_entry"]


def encode_entry(entry: LedgerEntry) -> bytes:
    data: dict[str, Any] = {
        "request_id": entry.request_id,
        "tenant": entry.tenant,
        "principal": entry.principal,
        "created_at": entry.created_at.isoformat(),
        "outcome": entry.outcome,
        "status_code": entry.status_code,
        "requested_model": entry.requested_model,
        "tier": entry.tier,
        "deployment": entry.deployment,
        "rule": entry.rule,
        "score": entry.score,
        "stream": entry.stream,
        "app": entry.app,
        "tags": list(entry.tags),
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "cost_micro_usd": entry.cost_micro_usd,
        "baseline_micro_usd": entry.baseline_micro_usd,
        "price_known": entry.price_known,
        "latency_ms": entry.latency_ms,
        "ttft_ms": entry.ttft_ms,
        "queue_ms": entry.queue_ms,
        "attempts": [a.to_dict() for a in entry.attempts],
    }
    if entry.idempotency_key is not None:  # absent from events of older writers, and most rows
        data["idempotency_key"] = entry.idempotency_key
    if entry.estimated_micro_usd is not None:  # likewise: only rows with estimated tokens
        data["estimated_micro_usd"] = entry.estimated_micro_usd
    if entry.provisional:  # likewise: only the edge's 504 of a started job
        data["provisional"] = True
    if entry.superseded_at is not None:  # set by the ledger: a row read back (``ledger show``)
        data["superseded_at"] = entry.superseded_at.isoformat()
    return orjson.dumps(data)


def decode_entry(raw: bytes) -> LedgerEntry:
    data = orjson.loads(raw)
    return LedgerEntry(
        request_id=data["request_id"],
        tenant=data["tenant"],
        principal=data["principal"],
        created_at=datetime.fromisoformat(data["created_at"]),
        outcome=data["outcome"],
        status_code=int(data["status_code"]),
        requested_model=data.get("requested_model", ""),
        tier=data.get("tier"),
        deployment=data.get("deployment"),
        rule=data.get("rule"),
        score=data.get("score"),
        stream=bool(data.get("stream", False)),
        app=data.get("app"),
        tags=tuple(data.get("tags", ())),
        prompt_tokens=int(data.get("prompt_tokens", 0)),
        completion_tokens=int(data.get("completion_tokens", 0)),
        cost_micro_usd=data.get("cost_micro_usd"),
        baseline_micro_usd=data.get("baseline_micro_usd"),
        price_known=bool(data.get("price_known", True)),
        latency_ms=float(data.get("latency_ms", 0.0)),
        ttft_ms=data.get("ttft_ms"),
        queue_ms=data.get("queue_ms"),
        attempts=tuple(Attempt.from_dict(a) for a in data.get("attempts", ())),
        idempotency_key=data.get("idempotency_key"),
        estimated_micro_usd=data.get("estimated_micro_usd"),
        provisional=data.get("provisional") is True,
        superseded_at=_time_or_none(data.get("superseded_at")),
    )


def _time_or_none(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
