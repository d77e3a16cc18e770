"""``LedgerEntry`` round trips, for any entry: through its event (JSON on the stream) and through
a real SQL row (SQLite), with every field compared; and no field goes without a column."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.accounting import SqlLedger
from gateway.accounting.events import decode_entry, encode_entry
from gateway.accounting.records import Attempt, LedgerEntry
from gateway.accounting.schema import ledger_entries

EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
money = st.none() | st.integers(-(2**62), 2**62)
attempts = st.builds(
    Attempt,
    deployment=text,
    outcome=text,
    latency_ms=st.integers(0, 10**9).map(lambda n: n / 1000),  # the event keeps 3 decimals
    prompt_tokens=st.integers(0, 2**40),
    completion_tokens=st.integers(0, 2**40),
    error=st.none() | text,
    estimated=st.booleans(),
)
entries = st.builds(
    LedgerEntry,
    request_id=text,
    tenant=text,
    principal=text,
    created_at=times,
    outcome=text,
    status_code=st.integers(100, 599),
    requested_model=text,
    tier=st.none() | text,
    deployment=st.none() | text,
    rule=st.none() | text,
    score=st.none() | finite,
    stream=st.booleans(),
    app=st.none() | text,
    tags=st.lists(text, max_size=3).map(tuple),
    prompt_tokens=st.integers(0, 2**40),
    completion_tokens=st.integers(0, 2**40),
    cost_micro_usd=money,
    baseline_micro_usd=money,
    price_known=st.booleans(),
    latency_ms=finite,
    ttft_ms=st.none() | finite,
    queue_ms=st.none() | finite,
    attempts=st.lists(attempts, max_size=3).map(tuple),
    idempotency_key=st.none() | text,
    estimated_micro_usd=money,
    provisional=st.booleans(),
    superseded_at=st.none() | times,
    cost_nano_usd=money,
    baseline_nano_usd=money,
    price_source=st.none() | text,
    endpoint=st.sampled_from(["chat", "completions", "responses", "embeddings"]),
)


def test_the_strategy_sets_every_field() -> None:
    """A field added to ``LedgerEntry`` must be added here too, or it is not round-tripped."""
    assert set(entries.wrapped_strategy.kwargs) == {f.name for f in dataclasses.fields(LedgerEntry)}


@EXAMPLES
@given(entries)
def test_event_round_trip(entry: LedgerEntry) -> None:
    assert decode_entry(encode_entry(entry)) == entry


def test_every_field_has_a_column() -> None:
    names = {f.name for f in dataclasses.fields(LedgerEntry)}
    assert names <= set(ledger_entries.c.keys())


def test_sql_round_trip(tmp_path: Path) -> None:
    """Booked by ``SqlLedger.record`` and read back by ``get``: the same entry, but that a
    ``None`` cost is always booked as an unknown price."""
    loop = asyncio.new_event_loop()
    try:
        ledger = loop.run_until_complete(SqlLedger.connect(f"sqlite+aiosqlite:///{tmp_path}/l.db"))

        @EXAMPLES
        @given(entries)
        def round_trip(entry: LedgerEntry) -> None:
            entry = dataclasses.replace(entry, request_id=uuid.uuid4().hex)
            assert loop.run_until_complete(ledger.record(entry))
            back = loop.run_until_complete(ledger.get(entry.request_id))
            known = entry.price_known and entry.cost_micro_usd is not None
            assert back == dataclasses.replace(entry, price_known=known)

        try:
            round_trip()
        finally:
            loop.run_until_complete(ledger.aclose())
    finally:
        loop.close()
