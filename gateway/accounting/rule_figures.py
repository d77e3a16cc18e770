"""Per-rule figures: what each routing rule did over a period, from the ledger's ``rule`` column.

One cost report grouped by rule and tier (``gateway.accounting.reports.cost_report``: the same
SQL sums as every other report) gives, for each value of ``rule`` (``rule:<id>``, or what
decided when no rule fired: ``auto:threshold``, ``spill:large_wait``, …): the requests it
decided, how many went to the large tier, their cost, their baseline and the saving against it.
Nothing is re-derived here: the per-tier rows of one rule are added up, integer micro-dollars.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import date

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.reports import CostSums, cost_report

__all__ = ["RuleFigures", "rule_figures"]

LARGE = "large"


@dataclass(frozen=True, slots=True)
class RuleFigures:
    """One value of the ledger's ``rule`` column over a period."""

    rule: str | None
    """``rule:<id>``, another decision (``auto:threshold``, …), or ``None`` (never routed)."""
    sums: CostSums
    large: int
    """Requests of these that went to the large tier."""

    @property
    def large_share(self) -> float | None:
        """Share of the requests sent large; ``None`` without requests."""
        return self.large / self.sums.requests if self.sums.requests else None


def _add(parts: Iterable[CostSums]) -> CostSums:
    totals = dict.fromkeys((f.name for f in fields(CostSums)), 0)
    for part in parts:
        for name in totals:
            totals[name] += getattr(part, name)
    return CostSums(**totals)


async def rule_figures(
    ledger: SqlLedger, *, tenant: str, start: date | None, end: date | None
) -> tuple[dict[str | None, RuleFigures], CostSums]:
    """Each ``rule`` value's figures for ``tenant`` over ``[start, end]`` (UTC days), and the
    totals over all its rows."""
    report = await cost_report(
        ledger, tenant=tenant, start=start, end=end, group_by=("rule", "tier")
    )
    parts: dict[str | None, list[CostSums]] = {}
    large: dict[str | None, int] = {}
    for row in report.rows:
        rule, tier = row.group
        key = None if rule is None else str(rule)
        parts.setdefault(key, []).append(row.sums)
        if tier == LARGE:
            large[key] = large.get(key, 0) + row.sums.requests
    figures = {key: RuleFigures(key, _add(sums), large.get(key, 0)) for key, sums in parts.items()}
    return figures, report.totals
