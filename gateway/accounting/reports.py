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
from gateway.accounting.records import MICRO, NANO
from gateway.accounting.schema import gpu_trueup, ledger_entries

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
    "price_source",
    "endpoint",
)
"""What a report can group by. ``model`` is the deployment that answered; ``price_source``
where its prices came from (``LedgerEntry.price_source``; rows booked before 0008: none);
``endpoint`` the API called (``chat``, ``completions``, ``responses``, ``embeddings``)."""

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
    "price_source": ledger_entries.c.price_source,
    "endpoint": ledger_entries.c.endpoint,
}


def _usd(micro: int) -> Decimal:
    return (Decimal(micro) * MICRO).quantize(MICRO)


def _nusd(nano: int) -> Decimal:
    return (Decimal(nano) * NANO).quantize(NANO)


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
    cost_nano_usd: int | None = None
    """``cost`` to the nano-dollar (``None``: summed from micro-dollars only, as a rollup)."""
    baseline_nano_usd: int | None = None
    savings_nano_usd: int | None = None

    @property
    def cost(self) -> Decimal:
        return (
            _usd(self.cost_micro_usd) if self.cost_nano_usd is None else _nusd(self.cost_nano_usd)
        )

    @property
    def estimated_usd(self) -> Decimal:
        return _usd(self.estimated_micro_usd)

    @property
    def baseline(self) -> Decimal:
        if self.baseline_nano_usd is None:
            return _usd(self.baseline_micro_usd)
        return _nusd(self.baseline_nano_usd)

    @property
    def savings(self) -> Decimal:
        if self.savings_nano_usd is None:
            return _usd(self.savings_micro_usd)
        return _nusd(self.savings_nano_usd)


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
    trueup: tuple[TrueUpRow, ...] = ()
    """The GPU pools' true-up over the range, per tenant and pool (``gpu_trueup``)."""

    @property
    def trueup_usd(self) -> Decimal:
        return sum((t.trueup for t in self.trueup), Decimal(0))


@dataclass(frozen=True, slots=True)
class TrueUpRow:
    """What a tenant's share of a GPU pool's recorded cost adds to what its rows booked at the
    period's rate (``allocated - booked``; tenant ``''``: the idle days nobody used)."""

    tenant: str
    deployment: str
    tokens: int
    booked_micro_usd: int
    allocated_micro_usd: int

    @property
    def booked(self) -> Decimal:
        return Decimal(self.booked_micro_usd) * MICRO

    @property
    def allocated(self) -> Decimal:
        return Decimal(self.allocated_micro_usd) * MICRO

    @property
    def trueup(self) -> Decimal:
        return self.allocated - self.booked


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


def nano_columns() -> list[ColumnElement[Any]]:
    """Cost, baseline and savings in nano-dollars (rows booked before 0008: micro x 1000,
    exactly), after ``estimate_columns`` in a report."""
    c = ledger_entries.c
    cost = func.coalesce(c.cost_nano_usd, c.cost_micro_usd * 1000)
    base = func.coalesce(c.baseline_nano_usd, c.baseline_micro_usd * 1000)
    both_known = and_(c.cost_micro_usd.is_not(None), c.baseline_micro_usd.is_not(None))
    return [
        func.coalesce(func.sum(cost), 0).label("cost_nano_usd"),
        func.coalesce(func.sum(base), 0).label("baseline_nano_usd"),
        func.coalesce(func.sum(case((both_known, base - cost), else_=0)), 0).label("savings_nano"),
    ]


def _sums(row: Sequence[Any]) -> CostSums:
    return CostSums(*(int(v) for v in row))


def _filtered(
    query: Select[Any],
    tenant: str | None,
    start: date | None,
    end: date | None,
    app: str | None = None,
) -> Select[Any]:
    created = ledger_entries.c.created_at
    if tenant is not None:
        query = query.where(ledger_entries.c.tenant == tenant)
    if app is not None:
        query = query.where(ledger_entries.c.app == app)
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
    query = select(*labelled, *sum_columns(), *estimate_columns(), *nano_columns()).select_from(
        source
    )
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
    app: str | None = None,
) -> CostReport:
    """Sums of ``ledger`` rows of ``tenant`` (every tenant when ``None``) between ``start`` and
    ``end`` (UTC days, inclusive), one row per distinct ``group_by`` values, plus totals."""
    group_by = tuple(group_by)
    unknown = [g for g in group_by if g not in GROUP_KEYS]
    if unknown or len(set(group_by)) != len(group_by):
        raise ValueError(f"group_by {list(group_by)}: use distinct keys of {list(GROUP_KEYS)}")
    grouped = _filtered(_grouped_query(ledger.dialect, group_by), tenant, start, end, app)
    totals = _filtered(
        select(*sum_columns(), *estimate_columns(), *nano_columns()).select_from(ledger_entries),
        tenant,
        start,
        end,
        app,
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
        trueup=()  # the true-up is per tenant and pool, not per app
        if app is not None
        else await trueup_rows(ledger, tenant=tenant, start=start, end=end),
    )


async def trueup_rows(
    ledger: SqlLedger, *, tenant: str | None, start: date | None, end: date | None
) -> tuple[TrueUpRow, ...]:
    """The GPU true-up of the days in range, per tenant and pool (``tenant``: its rows only)."""
    t = gpu_trueup.c
    query = select(
        t.tenant,
        t.deployment,
        func.sum(t.tokens),
        func.sum(t.booked_micro_usd),
        func.sum(t.allocated_micro_usd),
    ).group_by(t.tenant, t.deployment)
    if tenant is not None:
        query = query.where(t.tenant == tenant)
    if start is not None:
        query = query.where(t.day >= start)
    if end is not None:
        query = query.where(t.day <= end)
    async with ledger.engine.connect() as conn:
        found = (await conn.execute(query)).all()
    rows = [
        TrueUpRow(str(r[0]), str(r[1]), int(r[2] or 0), int(r[3] or 0), int(r[4] or 0))
        for r in found
    ]
    return tuple(sorted(rows, key=lambda row: (row.tenant, row.deployment)))


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
    """USD with 6 decimals, or up to 9 where the nano-dollars are not zero."""
    return money_text(amount)


def money_text(amount: Decimal) -> str:
    """USD as a string: at least 6 decimals (micro-dollars), up to 9 (nano-dollars) where they
    are not zero: ``0.000060``, ``0.00000039``."""
    text = f"{amount.quantize(NANO):f}"
    head, _, tail = text.partition(".")
    tail = tail.rstrip("0").ljust(6, "0")
    return f"{head}.{tail}"


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
        "gpu_trueup": _trueup_json(report),
    }


def render_csv(report: CostReport, *, delimiter: str = ",") -> str:
    """One header line, then one line per row (no totals line); money with 6 decimals. The
    last column, ``line``, says what a line is: ``usage`` (ledger rows), or ``gpu-trueup`` (a
    tenant's true-up on a GPU pool over the range: its ``cost_usd`` is the true-up, its
    ``baseline_usd`` what the rows booked; ``tenant`` and ``model`` filled where grouped)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n", delimiter=delimiter)
    writer.writerow([*report.group_by, *_SUM_FIELDS, "line"])
    for row in report.rows:
        sums = _sums_json(row.sums)
        writer.writerow([*map(_group_text, row.group), *(sums[f] for f in _SUM_FIELDS), "usage"])
    for t in report.trueup:
        groups = [
            t.tenant if g == "tenant" else t.deployment if g == "model" else ""
            for g in report.group_by
        ]
        values: dict[str, object] = {f: "" for f in _SUM_FIELDS}
        values.update(
            prompt_tokens=t.tokens, cost_usd=_money(t.trueup), baseline_usd=_money(t.booked)
        )
        writer.writerow([*groups, *(values[f] for f in _SUM_FIELDS), "gpu-trueup"])
    return out.getvalue()


def _trueup_json(report: CostReport) -> dict[str, Any]:
    return {
        "trueup_usd": _money(report.trueup_usd),
        "rows": [
            {
                "tenant": t.tenant,
                "deployment": t.deployment,
                "tokens": t.tokens,
                "booked_usd": _money(t.booked),
                "allocated_usd": _money(t.allocated),
                "trueup_usd": _money(t.trueup),
            }
            for t in report.trueup
        ],
    }


def _cents(amount: Decimal) -> str:
    return display_usd(amount)


def display_usd(amount: Decimal) -> str:
    """Money for people: cents from a cent up (``$1,234.57``), below a cent as many decimals
    as its first two significant digits need, to the nano-dollar (``$0.000042``,
    ``$0.00000039``), so a sub-cent amount is never shown as ``$0.00``."""
    sign = "-" if amount < 0 else ""
    size = abs(amount)
    if size == 0:
        return "$0.00"
    if size >= CENT:
        rounded = size.quantize(CENT, rounding=ROUND_HALF_EVEN)
        return f"{sign}${rounded:,f}"
    digits = min(max(-size.adjusted() + 1, 2), 9)
    shown = size.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_EVEN)
    if shown == 0:
        return f"{sign}$0.000000001" if size else "$0.00"
    return f"{sign}${shown:f}"


def _estimated_text(sums: CostSums) -> str:
    return f"{_cents(sums.estimated_usd)} ({sums.estimated:,})" if sums.estimated else ""


_DROPPED_FIRST = (
    "prompt tokens",
    "completion tokens",
    "unpriced",
    "estimated",
    "baseline",
    "savings",
    "requests",
)
"""The columns a narrow terminal does without, first to last (never the groups or the cost)."""


def render_table(
    report: CostReport, *, title: str | None = None, width: int | None = None
) -> Table:
    """A rich table for people: money scaled to be read (``display_usd``), unpriced rows
    counted in a column, the cost resting on estimates (and its rows) in another, the GPU
    true-up on its own line. Group values (days, model ids) are never cut: on a terminal
    narrower than the whole table (``width``), columns are left out in ``_DROPPED_FIRST``
    order until the rest fits (``--format tsv`` or a pipe gives them all)."""
    from rich.table import Table  # rich is for the CLI, not the request path

    scope = report.tenant or "all tenants"
    totals = report.totals
    figures: list[tuple[str, str, list[str], bool]] = [  # header, footer, cells, essential
        ("requests", f"{totals.requests:,}", [f"{r.sums.requests:,}" for r in report.rows], True),
        (
            "prompt tokens",
            f"{totals.prompt_tokens:,}",
            [f"{r.sums.prompt_tokens:,}" for r in report.rows],
            False,
        ),
        (
            "completion tokens",
            f"{totals.completion_tokens:,}",
            [f"{r.sums.completion_tokens:,}" for r in report.rows],
            False,
        ),
        ("cost", _cents(totals.cost), [_cents(r.sums.cost) for r in report.rows], True),
        (
            "baseline",
            _cents(totals.baseline),
            [_cents(r.sums.baseline) for r in report.rows],
            True,
        ),
        ("savings", _cents(totals.savings), [_cents(r.sums.savings) for r in report.rows], True),
        (
            "unpriced",
            f"{totals.unknown_price:,}",
            [f"{r.sums.unknown_price:,}" if r.sums.unknown_price else "" for r in report.rows],
            False,
        ),
        (
            "estimated",
            _estimated_text(totals),
            [_estimated_text(r.sums) for r in report.rows],
            False,
        ),
    ]
    trueup = display_usd(report.trueup_usd) if report.trueup else None
    groups = [
        (name, [_group_text(r.group[i]) or "—" for r in report.rows])
        for i, name in enumerate(report.group_by)
    ]

    def needed(header: str, footer: str, cells: list[str]) -> int:
        return max([len(header), len(footer), *(len(c) for c in cells)]) + 3

    used = 1 + sum(needed(name, "total", cells) for name, cells in groups)
    used += sum(needed(h, f, c) for h, f, c, _e in figures)
    keep = {h for h, _f, _c, _e in figures}
    for header in _DROPPED_FIRST:
        if width is None or used <= width:
            break
        _h, footer, cells, _e = next(f for f in figures if f[0] == header)
        keep.discard(header)
        used -= needed(header, footer, cells)
    shown = [f for f in figures if f[0] in keep]
    table = Table(title=title or f"Cost — {scope}", show_footer=True)
    for i, (name, cells) in enumerate(groups):
        widest = max([len(name), *(len(c) for c in cells)])
        table.add_column(name, footer="total" if i == 0 else "", no_wrap=True, min_width=widest)
    for header, footer, _cells, _essential in shown:
        table.add_column(header, footer=footer, justify="right", no_wrap=True)
    for row_index in range(len(report.rows)):
        table.add_row(
            *(cells[row_index] for _name, cells in groups),
            *(cells[row_index] for _h, _f, cells, _e in shown),
        )
    if trueup is not None:  # the GPU pools' recorded cost beyond what was booked: its own line
        label = ["GPU true-up", *([""] * (len(groups) - 1))] if groups else []
        table.add_row(*label, *(trueup if h == "cost" else "" for h, _f, _c, _e in shown))
    return table
