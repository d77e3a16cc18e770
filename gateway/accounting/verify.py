"""``verify_ledger``: reconcile ledger rows, daily rollups, GPU true-ups and the event stream.

Checks, each difference listed with what it is about:

- **rollups** — every day with rows (in the range) has rollups equal to the rows recomputed now;
  no rollup group without rows. Today may lag the rows until the next rollup run (a note,
  not a difference), and so may a day one of whose rows was replaced
  since its rollup (a provisional 504 booked by its run: ``rollups.replaced_days``), until the
  rollup job's next run.
- **rows** — no row that answered with tokens and a known price is booked at $0; a row with an
  unknown price has no cost and vice versa; a row's estimated part of its cost
  (``estimated_micro_usd``) is within its cost (0 when the cost is unknown). The rows booked in
  part from estimated usage are counted, with their estimated cost, in a note: they are what to
  reconcile against the providers' invoices (docs/costs.md).
- **true-up** — each pool-day's allocations add up to what the pool cost.
- **event stream** — events still in the stream are either already booked identically (awaiting
  acknowledgement) or not yet booked (counted as in flight); a booked row that differs from its
  event is a difference; an event that cannot be decoded is a difference. A provisional event
  whose row a run's entry has replaced since counts as booked; a run's event whose row is still
  provisional, as in flight.
- **dead letters** — no ledger event was set aside by the sink (``ledger_dead_letters``: events
  it could not decode or SQL refused); each one is a request the ledger holds no row for, listed
  with its request id and reason until an operator has dealt with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.accounting.dead_letters import DeadLetters
from gateway.accounting.events import decode_entry
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import MICRO, LedgerEntry
from gateway.accounting.reports import day_column
from gateway.accounting.rollups import ROLLUP_COLUMNS, daily_query, replaced_days
from gateway.accounting.schema import gpu_trueup, ledger_daily, ledger_entries
from gateway.accounting.supersede import replaces

__all__ = ["Difference", "VerifyReport", "verify_ledger"]

_KEY = ROLLUP_COLUMNS[:5]


@dataclass(frozen=True, slots=True)
class Difference:
    check: str
    detail: str


@dataclass(slots=True)
class VerifyReport:
    rows: int = 0
    days: int = 0
    rollup_groups: int = 0
    stream_events: int = 0
    stream_booked: int = 0
    stream_in_flight: int = 0
    dead_letters: int = 0
    """Ledger events the sink set aside (``gateway.accounting.dead_letters``)."""
    estimated_rows: int = 0
    """Rows booked in part from estimated usage."""
    estimated_micro_usd: int = 0
    """The part of their cost priced from the estimates."""
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


def _day_filter(column: Any, start: date | None, end: date | None) -> list[Any]:
    where = []
    if start is not None:
        where.append(column >= start)
    if end is not None:
        where.append(column <= end)
    return where


def _created_filter(start: date | None, end: date | None) -> list[Any]:
    created = ledger_entries.c.created_at
    where = []
    if start is not None:
        where.append(created >= datetime.combine(start, time(), UTC))
    if end is not None:
        where.append(created < datetime.combine(end + timedelta(days=1), time(), UTC))
    return where


def _as_date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


async def _check_rollups(
    ledger: SqlLedger, report: VerifyReport, start: date | None, end: date | None, today: date
) -> None:
    async with ledger.engine.connect() as conn:
        row_days = {
            _as_date(d)
            for (d,) in (
                await conn.execute(
                    select(day_column(ledger.dialect))
                    .where(*_created_filter(start, end))
                    .distinct()
                )
            ).all()
        }
        rolled_days = {
            _as_date(d)
            for (d,) in (
                await conn.execute(
                    select(ledger_daily.c.day)
                    .where(*_day_filter(ledger_daily.c.day, start, end))
                    .distinct()
                )
            ).all()
        }
        report.days = len(row_days | rolled_days)
        replaced = set(await replaced_days(conn, datetime.now(UTC)))
        for day in sorted(row_days | rolled_days):
            fresh = {
                tuple(r[:5]): tuple(int(v) for v in r[5:])
                for r in (await conn.execute(daily_query(ledger.dialect, day))).all()
            }
            stored_rows = (
                await conn.execute(
                    select(*(ledger_daily.c[n] for n in ROLLUP_COLUMNS)).where(
                        ledger_daily.c.day == day
                    )
                )
            ).all()
            stored = {tuple(r[:5]): tuple(int(v) for v in r[5:]) for r in stored_rows}
            fresh = {(_as_date(k[0]), *k[1:]): v for k, v in fresh.items()}
            stored = {(_as_date(k[0]), *k[1:]): v for k, v in stored.items()}
            report.rollup_groups += len(stored)
            if fresh == stored:
                continue
            if not stored and day >= today:
                report.notes.append(f"{day}: not rolled up yet ({len(fresh)} groups pending)")
                continue
            if day >= today:
                report.notes.append(f"{day}: rollup behind the rows (rolls up again shortly)")
                continue
            if day in replaced:
                report.notes.append(
                    f"{day}: rollup behind a row replaced since (a provisional 504 booked by "
                    "its run; the rollup job rolls the day up again shortly)"
                )
                continue
            for key in sorted(set(fresh) | set(stored), key=str):
                if fresh.get(key) != stored.get(key):
                    report.differences.append(
                        Difference(
                            "rollups",
                            f"{dict(zip(_KEY, map(str, key), strict=True))}: rows give "
                            f"{fresh.get(key)}, rollup holds {stored.get(key)}",
                        )
                    )


async def _check_rows(
    ledger: SqlLedger, report: VerifyReport, start: date | None, end: date | None
) -> None:
    c = ledger_entries.c
    where = _created_filter(start, end)
    async with ledger.engine.connect() as conn:
        report.rows = int(
            (
                await conn.execute(select(func.count()).select_from(ledger_entries).where(*where))
            ).scalar_one()
        )
        zero = (
            await conn.execute(
                select(c.request_id).where(
                    *where,
                    c.outcome == "ok",
                    c.price_known.is_(True),
                    func.coalesce(c.cost_nano_usd, c.cost_micro_usd * 1000) == 0,
                    c.prompt_tokens + c.completion_tokens > 0,
                )
            )
        ).scalars()
        for rid in zero:
            report.differences.append(Difference("rows", f"{rid}: tokens booked at $0"))
        odd = (
            await conn.execute(
                select(c.request_id).where(
                    *where,
                    or_(
                        and_(c.price_known.is_(True), c.cost_micro_usd.is_(None)),
                        and_(c.price_known.is_(False), c.cost_micro_usd.is_not(None)),
                    ),
                )
            )
        ).scalars()
        for rid in odd:
            report.differences.append(Difference("rows", f"{rid}: price_known disagrees with cost"))
        await _check_estimates(conn, report, where)


async def _check_estimates(conn: AsyncConnection, report: VerifyReport, where: list[Any]) -> None:
    c = ledger_entries.c
    estimated = c.estimated_micro_usd
    outside = (
        await conn.execute(
            select(c.request_id).where(
                *where,
                or_(
                    estimated < 0,
                    and_(c.cost_micro_usd.is_not(None), estimated > c.cost_micro_usd),
                    and_(c.cost_micro_usd.is_(None), estimated != 0),
                ),
            )
        )
    ).scalars()
    for rid in outside:
        report.differences.append(Difference("rows", f"{rid}: estimated cost is not within cost"))
    count, micro = (
        await conn.execute(
            select(func.count(), func.coalesce(func.sum(estimated), 0)).where(
                *where, estimated.is_not(None)
            )
        )
    ).one()
    report.estimated_rows, report.estimated_micro_usd = int(count), int(micro)
    if report.estimated_rows:
        usd = Decimal(report.estimated_micro_usd) * MICRO
        report.notes.append(
            f"{report.estimated_rows} requests booked in part from estimated usage, "
            f"${usd:f} of their cost (reconcile against the providers' invoices)"
        )


async def _check_trueup(
    ledger: SqlLedger, report: VerifyReport, start: date | None, end: date | None
) -> None:
    t = gpu_trueup.c
    query = (
        select(
            t.day, t.deployment, func.sum(t.allocated_micro_usd), func.max(t.pool_paid_micro_usd)
        )
        .where(*_day_filter(t.day, start, end))
        .group_by(t.day, t.deployment)
    )
    async with ledger.engine.connect() as conn:
        for day, deployment, allocated, paid in (await conn.execute(query)).all():
            if int(allocated) != int(paid):
                report.differences.append(
                    Difference(
                        "true-up", f"{day} {deployment}: allocated {allocated}, pool cost {paid}"
                    )
                )


def _same(event: LedgerEntry, row: LedgerEntry) -> bool:
    def view(e: LedgerEntry) -> tuple[Any, ...]:
        return (
            e.tenant,
            e.deployment,
            e.prompt_tokens,
            e.completion_tokens,
            e.cost_micro_usd,
            e.baseline_micro_usd,
            e.estimated_micro_usd,
            e.cost_nano,
            e.baseline_nano,
            e.price_source,
        )

    return view(event) == view(row)


async def _check_stream(
    ledger: SqlLedger, report: VerifyReport, redis: aioredis.Redis, stream: str
) -> None:
    cursor = "-"
    while True:
        batch: Sequence[Any] = await redis.xrange(stream, min=cursor, count=1000) or []
        if cursor != "-" and batch:
            batch = batch[1:]
        if not batch:
            break
        for entry_id, fields in batch:
            report.stream_events += 1
            try:
                event = decode_entry(fields[b"e"])
            except (KeyError, ValueError, TypeError) as exc:
                report.differences.append(
                    Difference("stream", f"event {entry_id.decode()}: cannot be decoded ({exc})")
                )
                continue
            row = await ledger.get(event.request_id)
            if row is None or replaces(row, event):
                report.stream_in_flight += 1
            elif _same(event, row) or (event.provisional and row.superseded_at is not None):
                report.stream_booked += 1
            else:
                report.differences.append(
                    Difference("stream", f"{event.request_id}: booked row differs from its event")
                )
        cursor = batch[-1][0].decode()
    if report.stream_in_flight:
        report.notes.append(
            f"{report.stream_in_flight} events in the stream are not booked yet (the sink "
            "books them; run again to see them land)"
        )


_DEAD_LETTERS_LISTED = 20


async def _check_dead_letters(ledger: SqlLedger, report: VerifyReport) -> None:
    letters = DeadLetters(ledger.engine)
    report.dead_letters = await letters.count()
    if not report.dead_letters:
        return
    for letter in await letters.latest(_DEAD_LETTERS_LISTED):
        report.differences.append(
            Difference(
                "dead letters",
                f"event {letter.stream_id} (request {letter.request_id}, tenant "
                f"{letter.tenant}) set aside {letter.set_aside_at:%Y-%m-%d %H:%M:%S}Z, "
                f"no row: {letter.reason}",
            )
        )
    if report.dead_letters > _DEAD_LETTERS_LISTED:
        report.notes.append(
            f"{report.dead_letters} dead letters in all; the newest {_DEAD_LETTERS_LISTED} listed"
            " (table ledger_dead_letters)"
        )


async def verify_ledger(
    ledger: SqlLedger,
    *,
    start: date | None = None,
    end: date | None = None,
    redis: aioredis.Redis | None = None,
    stream: str | None = None,
    today: date | None = None,
) -> VerifyReport:
    report = VerifyReport()
    today = today or datetime.now(UTC).date()
    await _check_rows(ledger, report, start, end)
    await _check_rollups(ledger, report, start, end, today)
    await _check_trueup(ledger, report, start, end)
    await _check_dead_letters(ledger, report)
    if redis is not None and stream is not None:
        await _check_stream(ledger, report, redis, stream)
    return report
