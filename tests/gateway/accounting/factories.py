"""Ledger entries for tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.accounting import Attempt, LedgerEntry

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def make_entry(request_id: str, **overrides: Any) -> LedgerEntry:
    values: dict[str, Any] = {
        "request_id": request_id,
        "tenant": "acme",
        "principal": "tenant:acme",
        "created_at": T0,
        "outcome": "ok",
        "status_code": 200,
        "requested_model": "auto",
        "tier": "small",
        "deployment": "llama-3.1-8b-instruct",
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cost_micro_usd": 30,
        "baseline_micro_usd": 120,
        "attempts": (Attempt("llama-3.1-8b-instruct", "ok", 12.5, 100, 20),),
    }
    values.update(overrides)
    return LedgerEntry(**values)
