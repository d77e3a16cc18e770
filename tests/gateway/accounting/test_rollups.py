"""Daily rollups, the GPU true-up and ``verify_ledger`` on real SQLite and PostgreSQL (+ Redis)."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import redis.asyncio as aioredis
from sqlalchemy import select, update

from gateway.accounting import Attempt, SqlLedger, cost_report
from gateway.accounting.events import encode_entry
from gateway.accounting.gpu_rates import GpuPool, GpuRates
from gateway.accounting.reports import render_csv, render_json
from gateway.accounting.rollups import RollupJob, allocate, paid_hours, rollup_day
from gateway.accounting.schema import gpu_trueup, ledger_daily
from gateway.accounting.verify import verify_ledger
from tests.gateway.accounting.factories import T0, make_entry

DAY = T0.date()
NOW = datetime(2025, 3, 5, tzinfo=UTC)
SMALL = "llama-3.1-8b-instruct"

ROWS = [
    make_entry("r1", tags=("chat", "eu")),
    make_entry("r2", tags=("chat",), cost_micro_usd=None, price_known=False),
    make_entry("r3", tenant="globex", principal="tenant:globex", prompt_tokens=300),
    make_entry("r4", created_at=T0 + timedelta(days=1)),
    make_entry(
        "r5",
        tenant="globex",
        principal="tenant:globex",
        deployment=None,
        tier=None,
        outcome="model_not_found",
        status_code=404,
        prompt_tokens=0,
        completion_tokens=0,
        cost_micro_usd=0,
        baseline_micro_usd=0,
    ),
]


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (100, {"a": 1, "b": 1, "c": 1}, {"a": 34, "b": 33, "c": 33}),
        (10, {"a": 2, "b": 1}, {"a": 7, "b": 3}),
        (0, {"a": 5}, {"a": 0}),
        (7, {}, {}),
        (1_000_001, {"x": 3, "y": 0}, {"x": 1_000_001, "y": 0}),
    ],
)
def test_allocate_adds_up_exactly(
    total: int, weights: dict[str, int], expected: dict[str, int]
) -> None:
    assert allocate(total, weights) == expected


def test_paid_hours() -> None:
    assert paid_hours(DAY, NOW) == 24
    assert (
        paid_hours(DAY, datetime.combine(DAY, datetime.min.time(), UTC) + timedelta(hours=6)) == 6
    )
    assert paid_hours(NOW.date() + timedelta(days=1), NOW) == 0


async def test_rollup_matches_the_report_and_is_idempotent(ledger: SqlLedger) -> None:
    await ledger.record_many(ROWS)
    first = await rollup_day(ledger, DAY, now=NOW)
    again = await rollup_day(ledger, DAY, now=NOW)
    assert first.groups == again.groups > 0
    async with ledger.engine.connect() as conn:
        rows = (
            (await conn.execute(select(ledger_daily).where(ledger_daily.c.day == DAY)))
            .mappings()
            .all()
        )
    by_key = {(r["tenant"], r["deployment"], r["tag"]): r for r in rows}
    assert set(by_key) == {
        ("acme", SMALL, "chat"),
        ("acme", SMALL, "eu"),
        ("globex", SMALL, ""),
        ("globex", "", ""),
    }
    chat = by_key[("acme", SMALL, "chat")]
    assert (chat["requests"], chat["cost_micro_usd"], chat["unknown_price"]) == (2, 30, 1)
    report = await cost_report(ledger, tenant=None, start=DAY, end=DAY, group_by=("tenant", "tag"))
    for row in report.rows:
        key = (row.group[0], SMALL, row.group[1] or "")
        if key in by_key:
            assert by_key[key]["cost_micro_usd"] == row.sums.cost_micro_usd


HOSTED = "gpt-4o-mini"
ESTIMATED = Attempt(HOSTED, "timeout", 4000.0, 230, 0, "timed out", estimated=True)
EXACT = Attempt(SMALL, "ok", 12.5, 100, 20)


async def test_rollups_carry_the_estimated_requests_and_cost(ledger: SqlLedger) -> None:
    """Per group, as the cost report counts them: the requests booked in part from estimates
    and the part of the cost priced from them (0 where nothing was estimated)."""
    await ledger.record_many(
        [
            *ROWS,
            make_entry(
                "e1",
                tags=("chat",),
                cost_micro_usd=95,
                estimated_micro_usd=65,
                attempts=(ESTIMATED, EXACT),
            ),
            make_entry(
                "e2",
                tags=("chat",),
                cost_micro_usd=65,
                estimated_micro_usd=65,
                deployment=None,
                outcome="upstream_error",
                status_code=502,
                attempts=(ESTIMATED,),
            ),
            make_entry(  # an unknown price: counted, none of its cost is in any sum
                "e3",
                tenant="globex",
                principal="tenant:globex",
                cost_micro_usd=None,
                price_known=False,
                estimated_micro_usd=0,
                attempts=(ESTIMATED, EXACT),
            ),
        ]
    )
    await rollup_day(ledger, DAY, now=NOW)
    async with ledger.engine.connect() as conn:
        rows = (
            (await conn.execute(select(ledger_daily).where(ledger_daily.c.day == DAY)))
            .mappings()
            .all()
        )
    got = {
        (r["tenant"], r["deployment"], r["tag"]): (r["estimated"], r["estimated_micro_usd"])
        for r in rows
    }
    assert got == {
        ("acme", SMALL, "chat"): (1, 65),
        ("acme", SMALL, "eu"): (0, 0),
        ("acme", "", "chat"): (1, 65),
        ("globex", SMALL, ""): (1, 0),
        ("globex", "", ""): (0, 0),
    }
    report = await cost_report(
        ledger, tenant=None, start=DAY, end=DAY, group_by=("tenant", "model", "tag")
    )
    for row in report.rows:
        tenant, model, tag = row.group
        key = (tenant, model or "", tag or "")
        assert got[key] == (row.sums.estimated, row.sums.estimated_micro_usd), key
    assert (await verify_ledger(ledger, start=DAY, end=DAY, today=NOW.date())).ok


async def test_verify_finds_a_rollup_that_lacks_the_estimated_cost(ledger: SqlLedger) -> None:
    """What a rollup made before the estimated columns existed reads (0), for a day with
    estimated rows: a difference until the day is rolled up again."""
    await ledger.record(
        make_entry("e1", cost_micro_usd=95, estimated_micro_usd=65, attempts=(ESTIMATED, EXACT))
    )
    await rollup_day(ledger, DAY, now=NOW)
    async with ledger.engine.begin() as conn:
        await conn.execute(update(ledger_daily).values(estimated=0, estimated_micro_usd=0))
    report = await verify_ledger(ledger, today=NOW.date())
    assert [d.check for d in report.differences] == ["rollups"]
    await rollup_day(ledger, DAY, now=NOW)
    assert (await verify_ledger(ledger, today=NOW.date())).ok


async def test_gpu_trueup_allocates_the_whole_day_by_token_share(ledger: SqlLedger) -> None:
    await ledger.record_many(ROWS)
    # $1.50/h for 24 h = $36 = 36_000_000 micro; acme 240 tokens (r1+r2), globex 320 (r3).
    await rollup_day(ledger, DAY, gpu={SMALL: Decimal("1.50")}, now=NOW)
    async with ledger.engine.connect() as conn:
        rows = (
            (await conn.execute(select(gpu_trueup).where(gpu_trueup.c.day == DAY))).mappings().all()
        )
    got = {
        r["tenant"]: (r["tokens"], r["allocated_micro_usd"], r["booked_micro_usd"]) for r in rows
    }
    assert got == {
        "acme": (240, 36_000_000 * 240 // 560, 30),
        "globex": (320, 36_000_000 * 320 // 560 + 1, 30),  # the larger remainder
    }
    assert sum(v[1] for v in got.values()) == 36_000_000
    # An idle day keeps the whole cost unallocated.
    idle = DAY + timedelta(days=2)
    await rollup_day(ledger, idle, gpu={SMALL: Decimal("1.50")}, now=NOW)
    async with ledger.engine.connect() as conn:
        rows = (
            (await conn.execute(select(gpu_trueup).where(gpu_trueup.c.day == idle)))
            .mappings()
            .all()
        )
    assert [(r["tenant"], r["allocated_micro_usd"]) for r in rows] == [("", 36_000_000)]


async def test_verify_is_clean_then_finds_each_difference(
    ledger: SqlLedger, redis: aioredis.Redis, key_prefix: str
) -> None:
    stream = f"{key_prefix}:ledger"
    await ledger.record_many(ROWS)
    for day in (DAY, DAY + timedelta(days=1)):
        await rollup_day(ledger, day, gpu={SMALL: Decimal("1")}, now=NOW)
    await redis.xadd(stream, {"e": encode_entry(ROWS[0])})  # booked, awaiting ack
    await redis.xadd(stream, {"e": encode_entry(make_entry("in-flight"))})
    report = await verify_ledger(ledger, redis=redis, stream=stream, today=NOW.date())
    assert report.ok, report.differences
    assert (report.rows, report.days, report.stream_booked, report.stream_in_flight) == (5, 2, 1, 1)
    assert report.estimated_rows == 0 and not any("estimated" in n for n in report.notes)

    # A row that arrives after its day was rolled up; a tampered rollup; a tampered true-up;
    # an event that disagrees with its row; a garbled event; a $0 row with tokens.
    await ledger.record(make_entry("late", tenant="initech", principal="tenant:initech"))
    async with ledger.engine.begin() as conn:
        await conn.execute(
            update(ledger_daily)
            .where(ledger_daily.c.day == DAY + timedelta(days=1))
            .values(cost_micro_usd=1)
        )
        await conn.execute(
            update(gpu_trueup).values(allocated_micro_usd=gpu_trueup.c.allocated_micro_usd + 1)
        )
    await redis.xadd(
        stream, {"e": encode_entry(make_entry("r3", tenant="globex", cost_micro_usd=99))}
    )
    await redis.xadd(stream, {"e": b"not json"})
    await ledger.record(make_entry("zero", created_at=T0 + timedelta(days=3), cost_micro_usd=0))
    # Estimated usage: one row as booked (a note), one whose estimated part exceeds its cost.
    later = T0 + timedelta(days=3)
    await ledger.record(make_entry("est", created_at=later, estimated_micro_usd=25))
    await ledger.record(make_entry("over", created_at=later, estimated_micro_usd=31))
    report = await verify_ledger(ledger, redis=redis, stream=stream, today=NOW.date())
    checks = sorted(d.check for d in report.differences)
    assert checks.count("rollups") == 3  # late row on DAY, tampered DAY+1, unrolled DAY+3
    assert checks.count("true-up") == 2
    assert checks.count("stream") == 2
    assert checks.count("rows") == 2
    assert any("zero: tokens booked at $0" in d.detail for d in report.differences)
    assert any("over: estimated cost is not within cost" in d.detail for d in report.differences)
    assert (report.estimated_rows, report.estimated_micro_usd) == (2, 56)
    assert any(n.startswith("2 requests booked in part from estimated usage") for n in report.notes)


async def test_gpu_trueup_charges_the_replica_time_recorded_not_the_configured_count(
    ledger: SqlLedger, redis: aioredis.Redis, key_prefix: str
) -> None:
    """The pool is configured with 2 replicas ($1.50/h each, $3/h) but KEDA ran one replica for
    3 hours and a second for 1 hour that day: the day's true-up is 4 replica-hours x $1.50 = $6,
    not 24 h x $3 = $72; the cost report and its CSV show each tenant's true-up line."""
    await ledger.record_many(ROWS)
    pool = GpuPool(SMALL, replica_hourly_usd=Decimal("1.50"), replicas=2)
    rates = GpuRates(redis, key_prefix, [pool])
    start = datetime.combine(DAY, datetime.min.time(), UTC).timestamp()
    for i in range(3 * 360):  # every 10 s bucket for 3 h: r1; the first hour also r2
        running = ["r1", "r2"] if i < 360 else ["r1"]
        await rates.record_running(SMALL, running, bucket_s=10, at=start + 10 * i)
    assert await rates.replica_seconds_of_day(SMALL, DAY) == 4 * 3600
    job = RollupJob(ledger, {SMALL: Decimal("3.00")}, rates=rates)
    await job.run_once(now=datetime.combine(DAY, datetime.min.time(), UTC) + timedelta(days=1))
    async with ledger.engine.connect() as conn:
        rows = (
            (await conn.execute(select(gpu_trueup).where(gpu_trueup.c.day == DAY))).mappings().all()
        )
    assert sum(r["allocated_micro_usd"] for r in rows) == 6_000_000
    assert {r["pool_paid_micro_usd"] for r in rows} == {6_000_000}
    assert {r["paid_hours"] for r in rows} == {4.0}
    report = await cost_report(ledger, tenant=None, start=DAY, end=DAY, group_by=("tenant",))
    shown = render_json(report)["gpu_trueup"]
    by_tenant = {r["tenant"]: r for r in shown["rows"]}
    shares = allocate(6_000_000, {"acme": 240, "globex": 320})
    assert by_tenant["acme"]["allocated_usd"] == f"{Decimal(shares['acme']) / 10**6:.6f}"
    assert by_tenant["acme"]["booked_usd"] == "0.000030"
    assert Decimal(shown["trueup_usd"]) == Decimal("6") - Decimal("0.000060")
    lines = list(csv.DictReader(io.StringIO(render_csv(report))))
    trueups = {r["tenant"]: r for r in lines if r["line"] == "gpu-trueup"}
    assert Decimal(trueups["globex"]["cost_usd"]) == Decimal(by_tenant["globex"]["trueup_usd"])
    own = await cost_report(ledger, tenant="acme", start=DAY, end=DAY, group_by=())
    assert [t.tenant for t in own.trueup] == ["acme"]
