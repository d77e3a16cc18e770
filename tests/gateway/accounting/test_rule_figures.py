"""Per-rule figures and the rows a what-if replays, on SQLite and PostgreSQL: the figures are
sums over the ledger rows, by the ``rule`` column; replay reads a tenant's routed rows of the
last days, newest first, with their tags and scores."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gateway.accounting import SqlLedger
from gateway.accounting.rule_figures import rule_figures
from gateway.rules.replay import ledger_calls
from tests.gateway.rules.console_rig import ledger_rows

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


async def test_figures_are_sums_over_the_rule_column(ledger: SqlLedger) -> None:
    rows = ledger_rows(NOW)
    await ledger.record_many(rows)
    found, totals = await rule_figures(ledger, tenant="acme", start=None, end=None)
    acme = [r for r in rows if r.tenant == "acme"]
    by_rule: dict[str | None, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in acme:
        sums = by_rule[r.rule]
        sums[0] += 1
        sums[1] += r.tier == "large"
        sums[2] += r.cost_micro_usd or 0
        sums[3] += (r.baseline_micro_usd or 0) - (r.cost_micro_usd or 0)
    assert set(found) == set(by_rule)
    for rule, (requests, large, cost, savings) in by_rule.items():
        got = found[rule]
        assert (got.sums.requests, got.large) == (requests, large), rule
        assert (got.sums.cost_micro_usd, got.sums.savings_micro_usd) == (cost, savings), rule
    assert found["rule:billing-large"].large_share == 1.0
    assert found["auto:threshold"].large_share == 5 / 11
    assert totals.requests == len(acme)
    assert totals.cost_micro_usd == sum(r.cost_micro_usd or 0 for r in acme)
    # The period is UTC days: a day before the rows has none.
    day = (NOW - timedelta(days=10)).date()
    empty, none = await rule_figures(ledger, tenant="acme", start=day, end=day)
    assert empty == {} and none.requests == 0


async def test_replay_reads_the_tenants_routed_rows_of_the_last_days(ledger: SqlLedger) -> None:
    rows = ledger_rows(NOW)
    old = ledger_rows(NOW - timedelta(days=30))[:3]
    old = [replace(r, request_id=f"old-{r.request_id}") for r in old]
    await ledger.record_many([*rows, *old])
    calls, truncated = await ledger_calls(ledger, "acme", days=7, now=NOW)
    routed = [r for r in rows if r.tenant == "acme" and r.tier is not None]
    assert not truncated and len(calls) == len(routed) == 20
    assert [c.created_at for c in calls] == sorted((c.created_at for c in calls), reverse=True)
    assert all(c.created_at.tzinfo is not None for c in calls)
    pii = [c for c in calls if c.tags == ("pii",)]
    assert len(pii) == 3 and all(c.score == 0.1 for c in pii)
    assert sum(c.app == "billing" for c in calls) == 4
    assert {c.tier for c in calls} == {"small", "large"}
