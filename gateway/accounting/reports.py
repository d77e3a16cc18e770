"""Cost reports: ledger sums grouped by day, model, tenant, tier, rule, app, outcome or tag.

Sums are exact: money is added as integer micro-dollars in SQL and turned into ``Decimal`` USD
here. A row whose price is unknown adds its tokens and counts under ``unknown_price``; its cost is
not in ``cost`` (it is not zero, it is unknown). ``savings`` is ``baseline - cost`` over the rows
where both are known, so with no unknowns it equals ``baseline - cost`` exactly. ``estimated``
counts the rows booked in part from estimated usage (a backend reported none for a call its
provider bills; docs/costs.md) and ``estimated_usd`` is the part of ``cost`` priced from those
estimates: what to reconcile against the providers' invoices.

Days are UTC calendar days; ``start`` and ``end`` are both inclusive. Grouping by ``tag`` counts a
request once under each of its tags (untagged requests under ``None``), so those rows may add up
to more than the totals, which always count each request once.

Rendering: ``render_json`` and ``render_csv`` give money as strings with 6 decimals (the ledger's
precision); only ``render_table`` (for people) rounds to cents.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Date,
    Select,
    and_,
    case,
    cast,
    func,
    or_,
    select,
    true,
)

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import MICRO
from gateway.accounting.schema import ledger_entries

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "GROUP_KEYS",
    "CostReport",
    "CostRow",
    "CostSums",
    "GroupValue",
    "cost_report",
    "day_column",
    "estimate_columns",
    "render_csv",
    "render_json",
    "render_table",
    "sum_columns",
]

GROUP_KEYS = (
    "day",
    "tenant",
    "model",
    "requested_model",
    "tier",
    "rule",
    "app",
    "outcome",
    "tag",
)
"""What a report can group by. ``model`` is the deployment that answered."""

GroupValue = date | str | None
CENT = Decimal("0.01")
_COLUMNS = {
    "tenant": ledger_entries.c.tenant,
    "model": ledger_entries.c.deployment,
    "requested_model": ledger_entries.c.requested_model,
    "tier": ledger_entries.c.tier,
    "rule": ledger_entries.c.rule,
    "app": ledger_entries.c.app,
    "outcome": ledger_entries.c.outcome,
}


def _usd(micro: int) -> Decimal:
    return (Decimal(micro) * MICRO).quantize(MICRO)


@dataclass(frozen=True, slots=True)
class CostSums:
    """Sums over a set of ledger rows; money in micro-dollars, ``Decimal`` USD as properties."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int = 0
    baseline_micro_usd: int = 0
    savings_micro_usd: int = 0
    unknown_price: int = 0
    """Rows whose cost is unknown (not in ``cost``)."""
    unknown_baseline: int = 0
    """Rows whose baseline cost is unknown (not in ``baseline``)."""
    estimated: int = 0
    """Rows booked in part from estimated usage (``LedgerEntry.estimated_micro_usd`` set)."""
    estimated_micro_usd: int = 0
    """The part of ``cost`` priced from estimated tokens."""

    @property
    def cost(self) -> Decimal:
        return _usd(self.cost_micro_usd)

    @property
    def estimated_usd(self) -> Decimal:
        return _usd(self.estimated_micro_usd)

    @property
    def baseline(self) -> Decimal:
        return _usd(self.baseline_micro_usd)

    @property
    def savings(self) -> Decimal:
        return _usd(self.savings_micro_usd)


@dataclass(frozen=True, slots=True)
class CostRow:
    group: tuple[GroupValue, ...]
    """One value per ``CostReport.group_by`` key."""
    sums: CostSums


@dataclass(frozen=True, slots=True)
class CostReport:
    tenant: str | None
    start: date | None
    end: date | None
    group_by: tuple[str, ...]
    rows: tuple[CostRow, ...]
    totals: CostSums


def day_column(dialect: str) -> ColumnElement[Any]:
    created = ledger_entries.c.created_at
    if dialect == "postgresql":
        return cast(func.timezone("UTC", created), Date)
    # SQLite stores the UTC wall time as text.
    return func.date(created)


def sum_columns() -> list[ColumnElement[Any]]:
    c = ledger_entries.c
    both_known = and_(c.cost_micro_usd.is_not(None), c.baseline_micro_usd.is_not(None))
    unknown_price = or_(c.cost_micro_usd.is_(None), c.price_known.is_(False))

    def total(expr: ColumnElement[Any], name: str) -> ColumnElement[Any]:
        return func.coalesce(func.sum(expr), 0).label(name)

    return [
        func.count().label("requests"),
        total(c.prompt_tokens, "prompt_tokens"),
        total(c.completion_tokens, "completion_tokens"),
        total(c.cost_micro_usd, "cost_micro_usd"),
        total(c.baseline_micro_usd, "baseline_micro_usd"),
        total(case((both_known, c.baseline_micro_usd - c.cost_micro_usd), else_=0), "savings"),
        total(case((unknown_price, 1), else_=0), "unknown_price"),
        total(case((c.baseline_micro_usd.is_(None), 1), else_=0), "unknown_baseline"),
    ]


def estimate_columns() -> list[ColumnElement[Any]]:
    """``CostSums.estimated`` and ``estimated_micro_usd``, after ``sum_columns`` in a report
    and in the daily rollups."""
    estimated = ledger_entries.c.estimated_micro_usd
    return [
        func.coalesce(func.sum(case((estimated.is_not(None), 1), else_=0)), 0).label("estimated"),
        func.coalesce(func.sum(estimated), 0).label("estimated_micro_usd"),
    ]


def _sums(row: Sequence[Any]) -> CostSums:
    return CostSums(*(int(v) for v in row))


def _filtered(
    query: Select[Any], tenant: str | None, start: date | None, end: date | None
) -> Select[Any]:
    created = ledger_entries.c.created_at
    if tenant is not None:
        query = query.where(ledger_entries.c.tenant == tenant)
    if start is not None:
        query = query.where(created >= datetime.combine(start, time(), UTC))
    if end is not None:
        query = query.where(created < datetime.combine(end + timedelta(days=1), time(), UTC))
    return query


def _grouped_query(dialect: str, group_by: Sequence[str]) -> Select[Any]:
    keys: list[ColumnElement[Any]] = []
    tags = None
    for name in group_by:
        if name == "day":
            keys.append(day_column(dialect))
        elif name == "tag":
            fn = "jsonb_array_elements_text" if dialect == "postgresql" else "json_each"
            tags = getattr(func, fn)(ledger_entries.c.tags).table_valued("value").alias("tag")
            keys.append(tags.c.value)
        else:
            keys.append(_COLUMNS[name])
    labelled = [k.label(f"k{i}") for i, k in enumerate(keys)]
    source = ledger_entries if tags is None else ledger_entries.outerjoin(tags, true())
    query = select(*labelled, *sum_columns(), *estimate_columns()).select_from(source)
    return query.group_by(*labelled) if labelled else query


def _group_value(name: str, value: Any) -> GroupValue:
    if value is None:
        return None
    if name == "day":
        return value if isinstance(value, date) else date.fromisoformat(str(value))
    return str(value)


def _sort_key(row: CostRow) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, "" if v is None else str(v)) for v in row.group)


async def cost_report(
    ledger: SqlLedger,
    *,
    tenant: str | None,
    start: date | None,
    end: date | None,
    group_by: Sequence[str] = ("day", "model"),
) -> CostReport:
    """Sums of ``ledger`` rows of ``tenant`` (every tenant when ``None``) between ``start`` and
    ``end`` (UTC days, inclusive), one row per distinct ``group_by`` values, plus totals."""
    group_by = tuple(group_by)
    unknown = [g for g in group_by if g not in GROUP_KEYS]
    if unknown or len(set(group_by)) != len(group_by):
        raise ValueError(f"group_by {list(group_by)}: use distinct keys of {list(GROUP_KEYS)}")
    grouped = _filtered(_grouped_query(ledger.dialect, group_by), tenant, start, end)
    totals = _filtered(
        select(*sum_columns(), *estimate_columns()).select_from(ledger_entries), tenant, start, end
    )
    async with ledger.engine.connect() as conn:
        group_rows = (await conn.execute(grouped)).all()
        total_row = (await conn.execute(totals)).one()
    n = len(group_by)
    rows = [
        CostRow(
            group=tuple(_group_value(name, v) for name, v in zip(group_by, r[:n], strict=True)),
            sums=_sums(r[n:]),
        )
        for r in group_rows
    ]
    rows.sort(key=_sort_key)
    return CostReport(
        tenant=tenant,
        start=start,
        end=end,
        group_by=group_by,
        rows=tuple(rows),
        totals=_sums(total_row),
    )


# --- rendering ------------------------------------------------------------------------------

_SUM_FIELDS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "baseline_usd",
    "savings_usd",
    "unknown_price",
    "unknown_baseline",
    "estimated",
    "estimated_usd",
)


def _money(amount: Decimal) -> str:
    return f"{amount.quantize(MICRO):f}"


def _group_text(value: GroupValue) -> str:
    if value is None:
        return ""
    return value.isoformat() if isinstance(value, date) else value


def _sums_json(sums: CostSums) -> dict[str, Any]:
    return {
        "requests": sums.requests,
        "prompt_tokens": sums.prompt_tokens,
        "completion_tokens": sums.completion_tokens,
        "cost_usd": _money(sums.cost),
        "baseline_usd": _money(sums.baseline),
        "savings_usd": _money(sums.savings),
        "unknown_price": sums.unknown_price,
        "unknown_baseline": sums.unknown_baseline,
        "estimated": sums.estimated,
        "estimated_usd": _money(sums.estimated_usd),
    }


def render_json(report: CostReport) -> dict[str, Any]:
    """A JSON-ready dict; money as strings with 6 decimals, days as ISO dates, ``None`` as null."""
    return {
        "tenant": report.tenant,
        "start": None if report.start is None else report.start.isoformat(),
        "end": None if report.end is None else report.end.isoformat(),
        "group_by": list(report.group_by),
        "rows": [
            {
                **{
                    name: None if v is None else _group_text(v)
                    for name, v in zip(report.group_by, row.group, strict=True)
                },
                **_sums_json(row.sums),
            }
            for row in report.rows
        ],
        "totals": _sums_json(report.totals),
    }


def render_csv(report: CostReport) -> str:
    """One header line, then one line per row (no totals line); money with 6 decimals."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*report.group_by, *_SUM_FIELDS])
    for row in report.rows:
        sums = _sums_json(row.sums)
        writer.writerow([*map(_group_text, row.group), *(sums[f] for f in _SUM_FIELDS)])
    return out.getvalue()


def _cents(amount: Decimal) -> str:
    rounded = amount.quantize(CENT, rounding=ROUND_HALF_EVEN)
    return f"{'-' if rounded < 0 else ''}${abs(rounded):,f}"


def _estimated_text(sums: CostSums) -> str:
    return f"{_cents(sums.estimated_usd)} ({sums.estimated:,})" if sums.estimated else ""


def render_table(report: CostReport, *, title: str | None = None) -> Table:
    """A rich table for people: money rounded to cents, unpriced rows counted in a column, the
    cost resting on estimates (and its rows) in another."""
    from rich.table import Table  # rich is for the CLI, not the request path

    scope = report.tenant or "all tenants"
    table = Table(title=title or f"Cost — {scope}", show_footer=True)
    for name in report.group_by:
        table.add_column(name, footer="total" if name == report.group_by[0] else "")
    totals = report.totals
    for header, value in (
        ("requests", f"{totals.requests:,}"),
        ("prompt tokens", f"{totals.prompt_tokens:,}"),
        ("completion tokens", f"{totals.completion_tokens:,}"),
        ("cost", _cents(totals.cost)),
        ("baseline", _cents(totals.baseline)),
        ("savings", _cents(totals.savings)),
        ("unpriced", f"{totals.unknown_price:,}"),
        ("estimated", _estimated_text(totals)),
    ):
        table.add_column(header, footer=value, justify="right")
    for row in report.rows:
        s = row.sums
        table.add_row(
            *(_group_text(v) or "—" for v in row.group),
            f"{s.requests:,}",
            f"{s.prompt_tokens:,}",
            f"{s.completion_tokens:,}",
            _cents(s.cost),
            _cents(s.baseline),
            _cents(s.savings),
            f"{s.unknown_price:,}" if s.unknown_price else "",
            _estimated_text(s),
        )
    return table
