"""Daily rollups of the ledger, and the daily GPU true-up.

``ledger_daily`` holds, per UTC day, the sums of the ledger's rows per tenant x deployment x tier
x tag (a request with several tags counts under each; untagged under ``''``), the cost report's
sums: tokens, cost, baseline, savings, unknown prices, and the requests booked in part from
estimated usage with the part of their cost priced from the estimates (``estimated``,
``estimated_micro_usd``; docs/costs.md). ``rollup_day``
recomputes one day from the rows in one transaction (delete, then ``INSERT … SELECT``), so running
it again, or from two processes, gives the same table; late rows are picked up by the next run.
``RollupJob`` recomputes yesterday and today, and every other day one of whose rows was replaced
after that day's rollup (``replaced_days``: a provisional 504 whose bookkeeping a run's entry
replaced later, ``gateway.accounting.supersede``), so a rollup never keeps a replaced row's old
figures.

The GPU true-up allocates what each GPU-priced pool actually cost that day — its hourly cost
times the hours of the day that have passed (24 for a past day), idle time included — to the
tenants by their share of the tokens the pool served (prompt + completion of the rows it
answered). Micro-dollars are split by largest remainder, so the allocations add up to the pool's
cost exactly. A day without tokens keeps its whole cost on tenant ``''`` (idle, unallocated).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import Select, and_, delete, func, literal, select, text, true
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.accounting.gpu_rates import GpuRates
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import PriceBook
from gateway.accounting.records import to_micro
from gateway.accounting.reports import day_column, estimate_columns, sum_columns
from gateway.accounting.schema import gpu_trueup, ledger_daily, ledger_entries
from gateway.loops import Loop

__all__ = [
    "ROLLUP_COLUMNS",
    "RollupJob",
    "RollupResult",
    "allocate",
    "daily_query",
    "paid_hours",
    "replaced_days",
    "rollup_day",
]

log = logging.getLogger(__name__)

ROLLUP_LOCK_KEY = 0x7467_726F_6C6C_7570
REPLACED_MARGIN = timedelta(minutes=1)
"""A day whose row was replaced less than this before its rollup is rolled up again: a
replacement committed while the rollup read the rows (its ``rolled_up_at`` is taken before), or
stamped by a process whose clock is behind the rollup's, may be missing from it."""
REPLACED_LOOKBACK = timedelta(days=7)
"""How far back ``replaced_days`` looks for replaced rows (an index range scan): a rollup job
stopped longer than this leaves older days to ``tiergate ledger rollup --day``, and
``tiergate ledger verify`` shows them."""
ROLLUP_COLUMNS = (
    "day",
    "tenant",
    "deployment",
    "tier",
    "tag",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cost_micro_usd",
    "baseline_micro_usd",
    "savings_micro_usd",
    "unknown_price",
    "unknown_baseline",
    "estimated",
    "estimated_micro_usd",
)


def _day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(), UTC)
    return start, start + timedelta(days=1)


def _on_day(day: date) -> Any:
    start, end = _day_bounds(day)
    return and_(ledger_entries.c.created_at >= start, ledger_entries.c.created_at < end)


def daily_query(dialect: str, day: date) -> Select[Any]:
    """One row per (day, tenant, deployment, tier, tag) of ``day``, in ``ROLLUP_COLUMNS`` order."""
    c = ledger_entries.c
    fn = "jsonb_array_elements_text" if dialect == "postgresql" else "json_each"
    tags = getattr(func, fn)(c.tags).table_valued("value").alias("tag")
    keys = [
        literal(day).label("day"),
        c.tenant.label("tenant"),
        func.coalesce(c.deployment, "").label("deployment"),
        func.coalesce(c.tier, "").label("tier"),
        func.coalesce(tags.c.value, "").label("tag"),
    ]
    return (
        select(*keys, *sum_columns(), *estimate_columns())
        .select_from(ledger_entries.outerjoin(tags, true()))
        .where(_on_day(day))
        .group_by(*keys[1:])
    )


def paid_hours(day: date, now: datetime) -> Decimal:
    """Hours of ``day`` (UTC) that have passed at ``now``: 24 for a past day."""
    start, end = _day_bounds(day)
    if now >= end:
        return Decimal(24)
    if now <= start:
        return Decimal(0)
    return Decimal(int((now - start).total_seconds())) / 3600


def allocate(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Split ``total`` micro-dollars by ``weights``, largest remainder first (ties by name), so
    the parts add up to ``total`` exactly."""
    weight = sum(weights.values())
    if weight <= 0:
        return {}
    parts = {k: total * w // weight for k, w in weights.items()}
    left = total - sum(parts.values())
    order = sorted(weights, key=lambda k: (-(total * weights[k] % weight), k))
    for k in order[:left]:
        parts[k] += 1
    return parts


async def replaced_days(
    conn: AsyncConnection, now: datetime, *, lookback: timedelta = REPLACED_LOOKBACK
) -> list[date]:
    """Days (UTC, of ``created_at``) with a row replaced since ``now - lookback`` after, or less
    than ``REPLACED_MARGIN`` before, the day's rollup; a day never rolled up counts too."""
    c = ledger_entries.c
    day = day_column(conn.dialect.name)
    query = (
        select(day, func.max(c.superseded_at))
        .where(c.superseded_at.is_not(None), c.superseded_at >= now - lookback)
        .group_by(day)
    )
    stale = []
    for value, last in (await conn.execute(query)).all():
        replaced_on = value if isinstance(value, date) else date.fromisoformat(str(value))
        rolled = (
            await conn.execute(
                select(func.min(ledger_daily.c.rolled_up_at)).where(
                    ledger_daily.c.day == replaced_on
                )
            )
        ).scalar_one_or_none()
        if rolled is None or last > rolled - REPLACED_MARGIN:
            stale.append(replaced_on)
    return sorted(stale)


@dataclass(frozen=True, slots=True)
class RollupResult:
    day: date
    groups: int
    trueup_rows: int


async def _trueup_rows(
    conn: AsyncConnection,
    day: date,
    gpu: Mapping[str, Decimal],
    now: datetime,
    running: Mapping[str, tuple[Decimal, int]],
) -> list[dict[str, Any]]:
    c = ledger_entries.c
    rows: list[dict[str, Any]] = []
    for deployment in sorted(gpu):
        if deployment in running:  # what the replicas recorded running cost (replica-hours)
            replica_hourly, replica_s = running[deployment]
            hours = Decimal(replica_s) / 3600
            pool_usd = replica_hourly * hours
        else:  # no record: the configured replicas, all the hours that passed
            hours = paid_hours(day, now)
            pool_usd = gpu[deployment] * hours
        query = (
            select(
                c.tenant,
                func.coalesce(func.sum(c.prompt_tokens + c.completion_tokens), 0),
                func.coalesce(func.sum(c.cost_micro_usd), 0),
            )
            .where(_on_day(day), c.deployment == deployment)
            .group_by(c.tenant)
        )
        usage = {str(t): (int(n), int(b)) for t, n, b in (await conn.execute(query)).all()}
        paid = to_micro(pool_usd)
        shares = allocate(paid, {t: n for t, (n, _b) in usage.items() if n > 0})
        if not shares:
            usage[""] = (0, 0)
            shares = {"": paid}
        for tenant, (tokens, booked) in sorted(usage.items()):
            rows.append(
                {
                    "day": day,
                    "deployment": deployment,
                    "tenant": tenant,
                    "tokens": tokens,
                    "booked_micro_usd": booked,
                    "allocated_micro_usd": shares.get(tenant, 0),
                    "pool_paid_micro_usd": paid,
                    "paid_hours": float(hours),
                    "rolled_up_at": now,
                }
            )
    return rows


async def rollup_day(
    ledger: SqlLedger,
    day: date,
    *,
    gpu: Mapping[str, Decimal] | None = None,
    now: datetime | None = None,
    running: Mapping[str, tuple[Decimal, int]] | None = None,
) -> RollupResult:
    """Recompute ``day``'s rollups (and GPU true-up for the pools in ``gpu``: model → pool $/h
    at its configured replicas) from the ledger rows, replacing what was there. ``running``:
    model → (one replica's $/h, replica-seconds recorded running on ``day``): the pool's cost
    is what its replicas ran (``gateway.accounting.gpu_rates``), not the configured count."""
    now = now or datetime.now(UTC)
    async with ledger.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ROLLUP_LOCK_KEY})
        await conn.execute(delete(ledger_daily).where(ledger_daily.c.day == day))
        source = daily_query(conn.dialect.name, day).add_columns(
            literal(now, ledger_daily.c.rolled_up_at.type)
        )
        insert = ledger_daily.insert().from_select([*ROLLUP_COLUMNS, "rolled_up_at"], source)
        groups = (await conn.execute(insert)).rowcount
        await conn.execute(delete(gpu_trueup).where(gpu_trueup.c.day == day))
        trueups = await _trueup_rows(conn, day, gpu or {}, now, running or {})
        if trueups:
            await conn.execute(gpu_trueup.insert(), trueups)
    return RollupResult(day, max(groups, 0), len(trueups))


async def replica_time(rates: GpuRates, day: date) -> dict[str, tuple[Decimal, int]]:
    """Each GPU pool's (replica $/h, replica-seconds recorded running on ``day``); a pool with
    no record that day is left out (its true-up assumes the configured replicas), and so is
    every pool when Redis cannot be read (logged)."""
    out: dict[str, tuple[Decimal, int]] = {}
    try:
        for name, pool in rates.pools.items():
            seconds = await rates.replica_seconds_of_day(name, day)
            if seconds is not None:
                out[name] = (pool.replica_hourly_usd, seconds)
    except (RedisError, OSError) as exc:
        log.warning("GPU replica record unavailable (%s): true-up at configured replicas", exc)
        return {}
    return out


class RollupJob:
    """Rolls up yesterday and today every ``interval_s`` (in the worker process)."""

    def __init__(
        self,
        ledger: SqlLedger,
        gpu: Mapping[str, Decimal],
        *,
        interval_s: float = 300.0,
        rates: GpuRates | None = None,
    ) -> None:
        self._ledger = ledger
        self._gpu = dict(gpu)
        self._rates = rates
        self._loop = Loop(
            "tiergate-ledger-rollups",
            self.run_once,
            every_s=interval_s,
            catch=(SQLAlchemyError, OSError),
            on_error=lambda exc: log.warning("ledger rollup failed: %s", type(exc).__name__),
        )

    @classmethod
    def from_prices(cls, ledger: SqlLedger, prices: PriceBook, **kwargs: Any) -> RollupJob:
        """A job that trues up every GPU-priced pool of ``prices``."""
        costs = {m: prices.gpu_cost(m) for m in prices.gpu_models}
        return cls(ledger, {m: c.hourly_usd for m, c in costs.items() if c is not None}, **kwargs)

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()

    async def run_once(self, now: datetime | None = None) -> Sequence[RollupResult]:
        """Roll up yesterday, today and the days with rows replaced since their rollup."""
        now = now or datetime.now(UTC)
        today = now.date()
        async with self._ledger.engine.connect() as conn:
            replaced = await replaced_days(conn, now)
        days = sorted({today - timedelta(days=1), today, *replaced})
        out = []
        for day in days:
            running = await replica_time(self._rates, day) if self._rates is not None else {}
            out.append(await rollup_day(self._ledger, day, gpu=self._gpu, now=now, running=running))
        return out
