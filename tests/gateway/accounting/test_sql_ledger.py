from __future__ import annotations

import asyncio
import dataclasses
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest
from sqlalchemy import func, inspect, select, text

from gateway.accounting import Attempt, SqlLedger
from gateway.accounting.events import decode_entry, encode_entry
from gateway.accounting.ledger import entry_to_row
from gateway.accounting.schema import ledger_entries

from .conftest import BACKENDS
from .factories import make_entry


async def count_rows(ledger: SqlLedger) -> int:
    async with ledger.engine.connect() as conn:
        return int(
            (await conn.execute(select(func.count()).select_from(ledger_entries))).scalar_one()
        )


async def test_round_trip_keeps_every_field(ledger: SqlLedger) -> None:
    entry = make_entry(
        "req-1",
        created_at=datetime(2025, 3, 1, 23, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5))),
        rule="long-prompts",
        score=0.8125,
        stream=True,
        app="chat",
        tags=("a", "b,c", "ünïcode"),
        ttft_ms=42.5,
        queue_ms=3.25,
        attempts=(
            Attempt("llama-3.1-70b-instruct", "timeout", 3000.0, error="read timeout"),
            Attempt("llama-3.1-8b-instruct", "ok", 12.5, 100, 20),
        ),
        idempotency_key="order-42",
        endpoint="embeddings",
    )
    assert decode_entry(encode_entry(entry)) == entry  # the sink's event carries every field
    assert await ledger.record(entry)
    got = await ledger.get("req-1")
    assert got is not None
    assert got.created_at.tzinfo is not None and got.created_at.utcoffset() == timedelta(0)
    assert got.created_at == datetime(2025, 3, 2, 4, 30, 15, 123456, tzinfo=UTC)
    assert got == entry  # aware datetimes compare by instant


async def test_duplicate_request_id_first_write_wins(ledger: SqlLedger) -> None:
    first = make_entry("dup", cost_micro_usd=10)
    assert await ledger.record(first) is True
    assert (
        await ledger.record(dataclasses.replace(first, cost_micro_usd=999, tenant="evil")) is False
    )
    assert await ledger.record(first) is False
    assert await count_rows(ledger) == 1
    got = await ledger.get("dup")
    assert got is not None and got.cost_micro_usd == 10 and got.tenant == "acme"


async def test_concurrent_duplicates_book_once(ledger: SqlLedger) -> None:
    entries = [make_entry("same", prompt_tokens=i) for i in range(25)]
    results = await asyncio.gather(*(ledger.record(e) for e in entries))
    assert results.count(True) == 1
    assert await count_rows(ledger) == 1


async def test_concurrent_distinct_all_booked(ledger: SqlLedger) -> None:
    results = await asyncio.gather(*(ledger.record(make_entry(f"r{i}")) for i in range(60)))
    assert all(results)
    assert await count_rows(ledger) == 60


async def test_get_enforces_tenant(ledger: SqlLedger) -> None:
    await ledger.record(make_entry("a-1", tenant="acme"))
    await ledger.record(make_entry("b-1", tenant="beta", principal="tenant:beta"))
    assert (await ledger.get("a-1", tenant="acme")) is not None
    assert await ledger.get("a-1", tenant="beta") is None
    assert await ledger.get("b-1", tenant="acme") is None
    got = await ledger.get("b-1", tenant="beta")
    assert got is not None and got.tenant == "beta"
    assert await ledger.get("missing") is None


async def test_unknown_price_is_null_and_flagged(ledger: SqlLedger) -> None:
    await ledger.record(
        make_entry("u1", cost_micro_usd=None, baseline_micro_usd=None, price_known=False)
    )
    # An entry that claims a known price but carries none is stored as unknown, not as zero.
    await ledger.record(make_entry("u2", cost_micro_usd=None, price_known=True))
    async with ledger.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(
                    ledger_entries.c.request_id,
                    ledger_entries.c.cost_micro_usd,
                    ledger_entries.c.baseline_micro_usd,
                    ledger_entries.c.price_known,
                ).order_by(ledger_entries.c.request_id)
            )
        ).all()
    assert [tuple(r) for r in rows] == [("u1", None, None, False), ("u2", None, 120, False)]
    got = await ledger.get("u1")
    assert got is not None and got.cost_usd is None and not got.price_known


async def test_estimated_usage_round_trips(ledger: SqlLedger) -> None:
    """A row whose hosted attempt was booked from estimates: the attempt's flag and the row's
    estimated cost survive the event and SQL; exact attempts carry no flag in their JSON."""
    entry = make_entry(
        "est-1",
        deployment="gpt-4o-mini",
        prompt_tokens=250,
        completion_tokens=40,
        cost_micro_usd=61,
        estimated_micro_usd=41,
        attempts=(
            Attempt("gpt-4o-mini", "timeout", 4000.0, 230, 0, "timed out", estimated=True),
            Attempt("llama-3.1-8b-instruct", "ok", 12.5, 20, 40),
        ),
    )
    assert entry.usage_estimated
    assert [a.to_dict().get("estimated") for a in entry.attempts] == [True, None]
    assert decode_entry(encode_entry(entry)) == entry
    assert await ledger.record(entry)
    assert await ledger.get("est-1") == entry


async def test_rows_and_attempts_from_before_the_flag_read_as_exact(ledger: SqlLedger) -> None:
    """Attempts booked before ``estimated`` existed have no such key, and their rows no
    estimated cost: they read as the backends' own counts."""
    old_attempt = {
        "deployment": "gpt-4o-mini",
        "outcome": "stream_cut",
        "latency_ms": 812.25,
        "prompt_tokens": 0,
        "completion_tokens": 40,
        "error": "stream ended before a finish_reason",
    }
    assert Attempt.from_dict(old_attempt) == Attempt(
        "gpt-4o-mini", "stream_cut", 812.25, 0, 40, "stream ended before a finish_reason"
    )
    row = {**entry_to_row(make_entry("old-1")), "attempts": [old_attempt]}
    del row["estimated_micro_usd"]  # as a writer before the column inserted it
    async with ledger.engine.begin() as conn:
        await conn.execute(ledger_entries.insert(), [row])
    got = await ledger.get("old-1")
    assert got is not None and got.estimated_micro_usd is None and not got.usage_estimated
    assert got.attempts[0].estimated is False
    event = orjson.loads(encode_entry(make_entry("old-2")))
    assert "estimated_micro_usd" not in event  # events of exact rows are as before
    assert decode_entry(orjson.dumps(event)).estimated_micro_usd is None


async def test_naive_datetime_refused(ledger: SqlLedger) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await ledger.record(make_entry("naive", created_at=datetime(2025, 1, 1)))
    assert await count_rows(ledger) == 0


async def test_large_money_values_fit(ledger: SqlLedger) -> None:
    big = 9_000_000_000_000_000  # 9e9 USD in micro-dollars: past 32 bits
    await ledger.record(make_entry("big", cost_micro_usd=big, baseline_micro_usd=big + 1))
    got = await ledger.get("big")
    assert got is not None and got.cost_micro_usd == big and got.baseline_micro_usd == big + 1


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
async def test_connect_twice_is_idempotent_and_ping(db_url: str) -> None:
    first = await SqlLedger.connect(db_url)
    second = await SqlLedger.connect(db_url)
    try:
        await first.ping()
        await second.ping()
        await second.migrate()
        async with first.engine.connect() as conn:
            names = await conn.run_sync(
                lambda sync: sorted(
                    i["name"] or "" for i in inspect(sync).get_indexes("ledger_entries")
                )
            )
        assert "ix_ledger_entries_tenant_created_at" in names
    finally:
        await first.aclose()
        await second.aclose()


async def test_sqlite_uses_wal(tmp_path: Path) -> None:
    ledger = await SqlLedger.connect(f"sqlite+aiosqlite:///{tmp_path / 'sub' / 'l.db'}")
    try:
        async with ledger.engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
            assert int((await conn.execute(text("PRAGMA busy_timeout"))).scalar_one()) >= 5000
    finally:
        await ledger.aclose()


async def test_sqlite_in_memory_is_one_database() -> None:
    ledger = await SqlLedger.connect("sqlite+aiosqlite:///:memory:")
    try:
        assert await ledger.record(make_entry("m1"))
        assert await ledger.get("m1") is not None
    finally:
        await ledger.aclose()


WORKER = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from gateway.accounting import SqlLedger
from factories import make_entry

async def main():
    ledger = await SqlLedger.connect({url!r})
    try:
        for i in range({n}):
            assert await ledger.record(make_entry(f"worker-{{i}}"))
            assert not await ledger.record(make_entry(f"main-{{i % 5}}"))  # main's, already in
    finally:
        await ledger.aclose()

asyncio.run(main())
"""


async def test_sqlite_separate_process_writes_concurrently(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    n = 150
    ledger = await SqlLedger.connect(url)
    try:
        for i in range(5):
            await ledger.record(make_entry(f"main-{i}"))
        code = WORKER.format(tests=str(Path(__file__).parent), url=url, n=n)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stderr=asyncio.subprocess.PIPE
        )
        done = asyncio.ensure_future(proc.wait())
        written = 5
        while not done.done():  # write while the other process writes
            await ledger.record(make_entry(f"main-{written}"))
            written += 1
            await asyncio.sleep(0)
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert written > 5, "the two processes did not overlap"
        assert await count_rows(ledger) == n + written
    finally:
        await ledger.aclose()


async def test_record_many_books_each_id_once(ledger: SqlLedger) -> None:
    assert await ledger.record(make_entry("pre", cost_micro_usd=1))
    batch = [make_entry(f"m{i}") for i in range(1_200)]  # more than one INSERT's worth
    batch += [make_entry("pre", cost_micro_usd=2), make_entry("m7", cost_micro_usd=3)]
    booked = await ledger.record_many(batch)
    assert booked == {f"m{i}" for i in range(1_200)}
    assert await count_rows(ledger) == 1_201
    pre, m7 = await ledger.get("pre"), await ledger.get("m7")
    assert pre is not None and pre.cost_micro_usd == 1
    assert m7 is not None and m7.cost_micro_usd == 30  # the batch's first m7 won
    assert await ledger.record_many(batch[:10]) == frozenset()
    assert await ledger.record_many([]) == frozenset()
