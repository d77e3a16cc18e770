"""A provisional row (the edge's 504 for a job a worker had started) and the run's entry that
replaces its bookkeeping: once, keeping the client's 504; first-wins for everything else. Real
SQLite and PostgreSQL; the event stream, the sink and the budgets on a real Redis; rollups,
the cost report and ``verify_ledger`` after the replacement."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy import func, select

from gateway.accounting import Attempt, LedgerEntry, SqlLedger
from gateway.accounting.budgets import BudgetBook, Released
from gateway.accounting.dead_letters import DeadLetters
from gateway.accounting.events import decode_entry, encode_entry
from gateway.accounting.reports import cost_report
from gateway.accounting.rollups import RollupJob, replaced_days, rollup_day
from gateway.accounting.schema import ledger_daily, ledger_entries
from gateway.accounting.sink import LedgerSink
from gateway.accounting.supersede import fold
from gateway.accounting.verify import verify_ledger
from gateway.accounting.writer import LedgerWriter
from tests.gateway.accounting.factories import T0, make_entry
from tests.gateway.accounting.test_budgets import book

HOSTED = "gpt-4o-mini"


def edge_504(request_id: str, **overrides: Any) -> LedgerEntry:
    """What the edge books for a started job that gave no answer in time (``book_refusal``)."""
    values: dict[str, Any] = {
        "outcome": "timeout",
        "status_code": 504,
        "deployment": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_micro_usd": 0,
        "baseline_micro_usd": 0,
        "attempts": (),
        "latency_ms": 125_000.0,
        "provisional": True,
        **overrides,
    }
    return make_entry(request_id, **values)


def run_entry(request_id: str, **overrides: Any) -> LedgerEntry:
    """What the run that took the job over books: the dead worker's hosted call (estimated)
    and its own answer."""
    lost = Attempt(HOSTED, "worker_lost", 0.0, 40, 0, error="in flight", estimated=True)
    ok = Attempt("llama-3.1-8b-instruct", "ok", 12.5, 100, 20)
    values: dict[str, Any] = {
        "outcome": "ok",
        "status_code": 200,
        "app": "chatbot",
        "tags": ("eu-pilot",),
        "prompt_tokens": 140,
        "completion_tokens": 20,
        "cost_micro_usd": 36,
        "baseline_micro_usd": 170,
        "estimated_micro_usd": 6,
        "attempts": (lost, ok),
        "latency_ms": 140_000.0,
        "ttft_ms": 139_000.0,
        "queue_ms": 30_000.0,
        "idempotency_key": "k-1",
        **overrides,
    }
    return make_entry(request_id, **values)


async def count_rows(ledger: SqlLedger) -> int:
    async with ledger.engine.connect() as conn:
        query = select(func.count()).select_from(ledger_entries)
        return int((await conn.execute(query)).scalar_one())


def bookkeeping(entry: LedgerEntry) -> tuple[Any, ...]:
    return (
        entry.tier,
        entry.deployment,
        entry.app,
        entry.tags,
        entry.prompt_tokens,
        entry.completion_tokens,
        entry.cost_micro_usd,
        entry.baseline_micro_usd,
        entry.price_known,
        entry.queue_ms,
        entry.attempts,
        entry.idempotency_key,
        entry.estimated_micro_usd,
    )


def assert_replaced(row: LedgerEntry | None, edge: LedgerEntry, run: LedgerEntry) -> None:
    """One row: the run's bookkeeping, the client's 504 and timings."""
    assert row is not None
    assert bookkeeping(row) == bookkeeping(run)
    assert (row.outcome, row.status_code) == ("timeout", 504)  # what the client got
    assert (row.latency_ms, row.ttft_ms) == (edge.latency_ms, None)
    assert (row.created_at, row.principal, row.requested_model) == (
        edge.created_at,
        edge.principal,
        edge.requested_model,
    )
    assert not row.provisional and row.superseded_at is not None


# -- the ledger: SQLite and PostgreSQL ------------------------------------------------------


async def test_a_runs_entry_replaces_the_provisional_rows_bookkeeping_once(
    ledger: SqlLedger,
) -> None:
    edge, run = edge_504("r1"), run_entry("r1")
    assert await ledger.record(edge) is True
    provisional = await ledger.get("r1")
    assert provisional is not None and provisional.provisional
    assert provisional.superseded_at is None
    assert await ledger.record(run) is True
    row = await ledger.get("r1")
    assert_replaced(row, edge, run)
    assert row is not None
    # the event delivered again, another run's entry, the edge's again: nothing changes
    assert await ledger.record(run) is False
    assert await ledger.record(run_entry("r1", cost_micro_usd=999_999)) is False
    assert await ledger.record(edge) is False
    assert await ledger.get("r1") == row
    assert await count_rows(ledger) == 1


async def test_a_runs_entry_that_came_first_takes_the_answer_the_client_got(
    ledger: SqlLedger,
) -> None:
    """A run books before it answers: its entry can be booked while its answer reaches an edge
    that had given up (a worker stopped at shutdown after the edge's 503; a reply delayed past
    the grace). The client got the edge's answer: the row says so, whichever came first."""
    edge, run = edge_504("r2"), run_entry("r2")
    assert await ledger.record(run) is True
    assert await ledger.record(edge) is True
    row = await ledger.get("r2")
    assert_replaced(row, edge, run)
    assert await ledger.record(edge) is False  # delivered twice: booked once
    assert await ledger.record(run) is False
    assert await ledger.get("r2") == row
    assert await count_rows(ledger) == 1


async def test_a_final_row_is_never_replaced(ledger: SqlLedger) -> None:
    never_started = edge_504("r3", provisional=False)  # a plain 504: the job never ran
    assert await ledger.record(never_started) is True
    assert await ledger.record(run_entry("r3")) is False
    assert await ledger.get("r3") == never_started
    # and a provisional entry replaces nothing, not even another provisional one
    assert await ledger.record(edge_504("r4")) is True
    assert await ledger.record(edge_504("r4", latency_ms=1.0)) is False
    row = await ledger.get("r4")
    assert row is not None and row.provisional and row.latency_ms == 125_000.0


async def test_a_batch_books_each_id_as_one_by_one_would(ledger: SqlLedger) -> None:
    """The sink's batches: both entries of an id in one batch (and its event twice)."""
    assert await ledger.record(edge_504("earlier")) is True
    batch = [
        edge_504("b1"),
        run_entry("b1"),
        run_entry("b1", cost_micro_usd=1),  # a second run's entry: too late
        run_entry("b2"),
        edge_504("b2"),
        run_entry("earlier"),  # the provisional row booked in an earlier batch
        run_entry("earlier"),
    ]
    assert await ledger.record_many(batch) == {"b1", "b2", "earlier"}
    assert_replaced(await ledger.get("b1"), edge_504("b1"), run_entry("b1"))
    assert_replaced(await ledger.get("b2"), edge_504("b2"), run_entry("b2"))
    assert_replaced(await ledger.get("earlier"), edge_504("earlier"), run_entry("earlier"))
    assert await ledger.record_many(batch) == frozenset()  # the whole batch again
    assert await count_rows(ledger) == 3


async def test_concurrent_run_entries_replace_the_provisional_row_once(
    ledger: SqlLedger,
) -> None:
    assert await ledger.record(edge_504("c1")) is True
    entries = [run_entry("c1", cost_micro_usd=100 + i) for i in range(20)]
    results = await asyncio.gather(*(ledger.record(e) for e in entries))
    assert results.count(True) == 1
    row = await ledger.get("c1")
    assert row is not None and row.cost_micro_usd == 100 + results.index(True)
    assert await count_rows(ledger) == 1


def test_fold_keeps_the_first_entry_unless_a_run_and_a_provisional_one_meet() -> None:
    at = datetime.now(UTC)
    folded = fold([run_entry("x"), edge_504("x"), edge_504("y"), edge_504("y"), run_entry("y")], at)
    assert [e.request_id for e in folded] == ["x", "y"]
    assert bookkeeping(folded[0]) == bookkeeping(run_entry("x"))
    assert (folded[0].status_code, folded[0].superseded_at, folded[0].provisional) == (
        504,
        at,
        False,
    )
    assert bookkeeping(folded[1]) == bookkeeping(run_entry("y"))
    assert (folded[1].status_code, folded[1].superseded_at, folded[1].provisional) == (
        504,
        at,
        False,
    )


def test_the_provisional_flag_travels_in_the_event() -> None:
    assert decode_entry(encode_entry(edge_504("e"))).provisional
    assert not decode_entry(encode_entry(run_entry("e"))).provisional
    assert b"provisional" not in encode_entry(run_entry("e"))  # events as before


# -- rollups, the report, verify ------------------------------------------------------------


async def _daily_cost(ledger: SqlLedger) -> int:
    async with ledger.engine.connect() as conn:
        query = select(func.coalesce(func.sum(ledger_daily.c.cost_micro_usd), 0)).where(
            ledger_daily.c.tag == ""
        )
        return int((await conn.execute(query)).scalar_one())


async def test_a_row_replaced_after_its_days_rollup_is_rolled_up_again(
    ledger: SqlLedger,
) -> None:
    """T0's day is long past: only the replacement makes the rollup job look at it again.
    Until then ``verify`` notes the rollup as behind (no difference); after, all agree."""
    await ledger.record(make_entry("plain", cost_micro_usd=30))
    await ledger.record(edge_504("late", tags=()))
    run = run_entry("late", tags=())
    await rollup_day(ledger, T0.date(), now=datetime.now(UTC) - timedelta(minutes=5))
    assert await _daily_cost(ledger) == 30
    assert (await verify_ledger(ledger)).ok

    assert await ledger.record(run)
    async with ledger.engine.connect() as conn:
        assert await replaced_days(conn, datetime.now(UTC)) == [T0.date()]
    report = await verify_ledger(ledger)
    assert report.ok, report.differences
    assert any("replaced since" in note for note in report.notes)
    totals = (await cost_report(ledger, tenant=None, start=None, end=None, group_by=())).totals
    assert totals.cost_micro_usd == 30 + run.cost_micro_usd  # the report reads the rows

    results = await RollupJob(ledger, {}).run_once(datetime.now(UTC) + timedelta(minutes=5))
    assert T0.date() in {r.day for r in results}
    assert await _daily_cost(ledger) == totals.cost_micro_usd
    report = await verify_ledger(ledger)
    assert report.ok and not any("replaced since" in note for note in report.notes)
    async with ledger.engine.connect() as conn:
        later = datetime.now(UTC) + timedelta(minutes=10)
        assert await replaced_days(conn, later) == []  # rolled up after it: done


# -- the event stream, the sink and the budgets on a real Redis -----------------------------


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def sink(redis: aioredis.Redis, prefix: str, ledger: SqlLedger) -> LedgerSink:
    return LedgerSink(
        redis=redis,
        blocking_redis=redis,
        stream=f"{prefix}:ledger",
        group="sink",
        consumer="sink-1",
        ledger=ledger,
        dead_letters=DeadLetters(ledger.engine),
        dead_letter_stream=f"{prefix}:ledger:dead",
    )


async def test_through_the_stream_and_sink_the_run_is_booked_once_and_the_budget_once(
    redis: aioredis.Redis, key_prefix: str, ledger: SqlLedger
) -> None:
    """The edge's provisional 504 settles nothing; the run's entry settles the real cost,
    once, even written twice (and its event delivered twice)."""
    budgets = book(redis, key_prefix, {"name": "m", "limit_usd": "10"})
    writer = LedgerWriter(redis, f"{key_prefix}:ledger", ledger, budgets=budgets)
    edge, run = edge_504("s1", created_at=T0), run_entry("s1", created_at=T0, tags=())
    await budgets.reserve(
        tenant="acme", request_id="s1", app=None, tags=(), amount_micro_usd=5_000, at=T0
    )
    await writer.write(edge)
    assert await spent_and_reserved(budgets) == (0, 5_000)  # still reserved: a run may book
    await writer.write(run)
    await writer.write(run)
    assert await spent_and_reserved(budgets) == (run.cost_micro_usd, 0)
    await sink(redis, key_prefix, ledger).drain()
    assert_replaced(await ledger.get("s1"), edge, run)
    assert await count_rows(ledger) == 1


async def test_the_run_books_its_cost_once_whether_the_sweep_releases_before_or_after(
    redis: aioredis.Redis, redis_url: str, key_prefix: str, ledger: SqlLedger
) -> None:
    """Nothing came before the bound: the sweep releases the reservation (the provisional
    row's $0 is all the budget saw). The run's entry then adds its real cost once; two
    processes writing it at once with a sweeper running change nothing more."""
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(3)]
    try:
        hard = {"name": "m", "limit_usd": "10"}
        books = [book(c, key_prefix, hard, release_after_s=0) for c in clients]
        writers = [LedgerWriter(c, f"{key_prefix}:ledger", ledger, budgets=b) for c, b in
                   zip(clients[:2], books[:2], strict=True)]  # fmt: skip
        for rid in ("late", "early"):
            await books[0].reserve(
                tenant="acme", request_id=rid, app=None, tags=(), amount_micro_usd=5_000, at=T0
            )
            await writers[0].write(edge_504(rid, created_at=T0))
        run_early = run_entry("early", created_at=T0, tags=(), cost_micro_usd=700)
        await asyncio.gather(*(w.write(run_early) for w in writers), books[2].sweep())
        assert await spent_and_reserved(books[2]) == (700, 0)  # released or settled: once
        assert await books[2].sweep() in ([], [Released("acme", 1, 5_000)])
        assert await spent_and_reserved(books[2]) == (700, 0)

        run_late = run_entry("late", created_at=T0, tags=(), cost_micro_usd=1_234)
        await asyncio.gather(*(w.write(run_late) for w in writers), books[2].sweep())
        assert await spent_and_reserved(books[2]) == (700 + 1_234, 0)
    finally:
        for client in clients:
            await client.aclose()
    await sink(redis, key_prefix, ledger).drain()
    assert await ledger.spent("acme", T0 - timedelta(days=1), T0 + timedelta(days=1)) == 1_934


async def spent_and_reserved(budgets: BudgetBook) -> tuple[int, int]:
    (status,) = await budgets.status("acme", T0)
    return status.spent_micro_usd, status.reserved_micro_usd


async def test_verify_reads_the_stream_across_a_replacement(
    redis: aioredis.Redis, key_prefix: str, ledger: SqlLedger
) -> None:
    """Events not acknowledged yet: the run's event while the row is still provisional is in
    flight; once replaced, the provisional event and the run's both count as booked."""
    stream = f"{key_prefix}:ledger"
    writer = LedgerWriter(redis, stream, ledger)
    edge, run = edge_504("v1", created_at=T0), run_entry("v1", created_at=T0)
    await writer.write(edge)
    await writer.write(run)
    assert await ledger.record(edge)
    await rollup_day(ledger, T0.date())
    report = await verify_ledger(ledger, redis=redis, stream=stream)
    assert report.ok, report.differences
    assert (report.stream_booked, report.stream_in_flight) == (1, 1)
    assert await ledger.record(run)
    await rollup_day(ledger, T0.date())
    report = await verify_ledger(ledger, redis=redis, stream=stream)
    assert report.ok, report.differences
    assert (report.stream_booked, report.stream_in_flight) == (2, 0)
