from __future__ import annotations

import asyncio
import csv
import io
import json
import random
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

import pytest
from rich.console import Console
from typer.testing import CliRunner

from backends.types import Usage
from gateway.accounting import (
    Attempt,
    CostReport,
    CostSums,
    PriceBook,
    SqlLedger,
    cost_report,
    render_csv,
    render_json,
    render_table,
)
from gateway.accounting.reports import display_usd
from gateway.cli.main import app
from gateway.settings import DeploymentSettings, PriceSettings, ReplicaSettings
from router.catalog import Tier
from tests.gateway.accounting.apps import EXAMPLE

from .factories import T0, make_entry

D1, D2, D3 = date(2025, 3, 1), date(2025, 3, 2), date(2025, 3, 3)
EST = timezone(timedelta(hours=-5))


def at(day: date, hour: int, minute: int = 0, tz: timezone = UTC, **kw: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz, **kw)


ENTRIES = [
    make_entry("r1", created_at=at(D1, 10), tags=("a", "b"), cost_micro_usd=30),
    # 23:30 in New York on 1 March is 04:30 UTC on 2 March.
    make_entry("r2", created_at=at(D1, 23, 30, EST), tags=("a",), cost_micro_usd=50,
               baseline_micro_usd=200, prompt_tokens=400, completion_tokens=50),
    make_entry("r3", created_at=at(D1, 23, 59, second=59, microsecond=999_999),
               deployment="large-a", tier="large", cost_micro_usd=500, baseline_micro_usd=500),
    make_entry("r4", created_at=at(D2, 0), deployment="ext", tier="external",
               cost_micro_usd=None, price_known=False, baseline_micro_usd=80),
    make_entry("r5", created_at=at(D3, 8), cost_micro_usd=10, baseline_micro_usd=None),
    make_entry("b1", tenant="beta", principal="tenant:beta", created_at=at(D1, 9),
               cost_micro_usd=7, baseline_micro_usd=9),
]  # fmt: skip
SMALL = "llama-3.1-8b-instruct"


@pytest.fixture
async def filled(ledger: SqlLedger) -> SqlLedger:
    assert len(await ledger.record_many(ENTRIES)) == len(ENTRIES)
    return ledger


def by_group(report: CostReport) -> dict[tuple[object, ...], CostSums]:
    return {row.group: row.sums for row in report.rows}


async def test_grouped_by_day_and_model(filled: SqlLedger) -> None:
    report = await cost_report(filled, tenant="acme", start=None, end=None)
    assert report.group_by == ("day", "model")
    assert [row.group for row in report.rows] == [
        (D1, "large-a"),
        (D1, SMALL),
        (D2, "ext"),
        (D2, SMALL),
        (D3, SMALL),
    ]
    groups = by_group(report)
    assert groups[(D1, SMALL)] == CostSums(
        1, 100, 20, 30, 120, 90, 0, 0, 0, 0, 30000, 120000, 90000
    )
    assert groups[(D2, SMALL)] == CostSums(
        1, 400, 50, 50, 200, 150, 0, 0, 0, 0, 50000, 200000, 150000
    )
    assert groups[(D1, "large-a")] == CostSums(
        1, 100, 20, 500, 500, 0, 0, 0, 0, 0, 500000, 500000, 0
    )
    assert groups[(D2, "ext")] == CostSums(1, 100, 20, 0, 80, 0, 1, 0, 0, 0, 0, 80000, 0)
    assert groups[(D3, SMALL)] == CostSums(1, 100, 20, 10, 0, 0, 0, 1, 0, 0, 10000, 0, 0)
    assert report.totals == CostSums(5, 800, 130, 590, 900, 240, 1, 1, 0, 0, 590000, 900000, 240000)
    assert report.totals.cost == Decimal("0.000590")
    assert report.totals.savings == Decimal("0.000240")


async def test_tenant_filter_and_isolation(filled: SqlLedger) -> None:
    beta = await cost_report(filled, tenant="beta", start=None, end=None, group_by=("tenant",))
    assert [(r.group, r.sums.requests, r.sums.cost_micro_usd) for r in beta.rows] == [
        (("beta",), 1, 7)
    ]
    nobody = await cost_report(filled, tenant="nobody", start=None, end=None)
    assert nobody.rows == () and nobody.totals == CostSums(
        cost_nano_usd=0, baseline_nano_usd=0, savings_nano_usd=0
    )
    everyone = await cost_report(filled, tenant=None, start=None, end=None, group_by=("tenant",))
    assert {r.group[0]: r.sums.requests for r in everyone.rows} == {"acme": 5, "beta": 1}
    assert everyone.totals.requests == 6 and everyone.totals.cost_micro_usd == 597


async def test_date_range_is_inclusive_utc_days(filled: SqlLedger) -> None:
    report = await cost_report(filled, tenant="acme", start=D2, end=D2, group_by=("day",))
    assert [r.group for r in report.rows] == [(D2,)]
    assert report.totals.requests == 2  # r2 (04:30 UTC) and r4 (midnight UTC)
    first = await cost_report(filled, tenant="acme", start=None, end=D1, group_by=())
    assert first.totals.requests == 2  # r1 and r3 (23:59:59.999999 UTC)
    later = await cost_report(filled, tenant="acme", start=D3, end=None, group_by=())
    assert later.totals.requests == 1


async def test_group_by_tag_counts_each_tag(filled: SqlLedger) -> None:
    report = await cost_report(filled, tenant="acme", start=None, end=None, group_by=("tag",))
    groups = {g[0]: s.requests for g, s in by_group(report).items()}
    assert groups == {"a": 2, "b": 1, None: 3}
    assert report.totals.requests == 5


async def test_group_by_nothing_and_other_keys(filled: SqlLedger) -> None:
    report = await cost_report(filled, tenant="acme", start=None, end=None, group_by=())
    assert [r.group for r in report.rows] == [()]
    assert report.rows[0].sums == report.totals
    tiers = await cost_report(
        filled, tenant="acme", start=None, end=None, group_by=("tier", "outcome")
    )
    assert [r.group for r in tiers.rows] == [
        ("external", "ok"),
        ("large", "ok"),
        ("small", "ok"),
    ]


@pytest.mark.parametrize("group_by", [("week",), ("day", "day")])
async def test_bad_group_by(ledger: SqlLedger, group_by: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="group_by"):
        await cost_report(ledger, tenant=None, start=None, end=None, group_by=group_by)


def _priced(model: str, tier: Tier, inp: str, out: str) -> DeploymentSettings:
    price = PriceSettings(input_per_mtok=Decimal(inp), output_per_mtok=Decimal(out))
    return DeploymentSettings(
        model=model, tier=tier, replicas=(ReplicaSettings(url="http://127.0.0.1:1"),), price=price
    )


def _half_even_micro(usd: Fraction) -> int:
    return round(usd * 1_000_000)  # round() on a Fraction is half-even


async def test_sums_are_exact_to_the_micro_dollar(ledger: SqlLedger) -> None:
    # gpt-4o-mini-like fractions of a micro-dollar per token, and a whole-micro-dollar baseline.
    prices = {"small": ("0.15", "0.60"), "large": ("3", "15")}
    book = PriceBook.from_settings(
        [
            _priced("small", Tier.SMALL, *prices["small"]),
            _priced("large", Tier.LARGE, *prices["large"]),
        ]
    )
    rng = random.Random(20250301)
    entries = []
    expected_cost = expected_base = 0
    exact_base = Fraction(0)
    for i in range(3_000):
        usage = Usage(rng.randint(1, 50_000), rng.randint(0, 4_000))
        charge = book.charge("small", usage, baseline="large")
        entries.append(
            make_entry(
                f"x{i}",
                created_at=at(D1, 0) + timedelta(seconds=i * 37),
                deployment="small",
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cost_micro_usd=charge.cost_micro_usd,
                baseline_micro_usd=charge.baseline_micro_usd,
            )
        )
        pin, pout = (Fraction(p) / 1_000_000 for p in prices["small"])
        expected_cost += _half_even_micro(
            usage.prompt_tokens * pin + usage.completion_tokens * pout
        )
        bin_, bout = (Fraction(p) / 1_000_000 for p in prices["large"])
        base = usage.prompt_tokens * bin_ + usage.completion_tokens * bout
        exact_base += base
        expected_base += _half_even_micro(base)
    await ledger.record_many(entries)
    report = await cost_report(ledger, tenant="acme", start=None, end=None, group_by=("day",))
    totals = report.totals
    assert totals.requests == 3_000
    assert totals.cost_micro_usd == expected_cost
    assert totals.baseline_micro_usd == expected_base
    # Whole micro-dollars per token: the ledger total is the sum of tokens * price, exactly.
    assert Fraction(totals.baseline) == exact_base
    assert totals.cost == Decimal(expected_cost) / 1_000_000
    assert totals.savings_micro_usd == expected_base - expected_cost
    assert sum(r.sums.cost_micro_usd for r in report.rows) == expected_cost


async def test_json_and_csv_output(filled: SqlLedger) -> None:
    report = await cost_report(filled, tenant="acme", start=D1, end=D3)
    data = render_json(report)
    json.dumps(data)  # serialisable as is
    assert (
        data["tenant"] == "acme" and data["start"] == "2025-03-01" and data["end"] == "2025-03-03"
    )
    assert data["group_by"] == ["day", "model"]
    assert data["rows"][1] == {
        "day": "2025-03-01",
        "model": SMALL,
        "requests": 1,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cost_usd": "0.000030",
        "baseline_usd": "0.000120",
        "savings_usd": "0.000090",
        "unknown_price": 0,
        "unknown_baseline": 0,
        "estimated": 0,
        "estimated_usd": "0.000000",
    }
    assert data["rows"][2]["unknown_price"] == 1 and data["rows"][2]["cost_usd"] == "0.000000"
    assert data["totals"]["cost_usd"] == "0.000590"
    assert data["totals"]["baseline_usd"] == "0.000900"

    text = render_csv(report)
    lines = text.splitlines()
    assert lines[0] == (
        "day,model,requests,prompt_tokens,completion_tokens,cost_usd,baseline_usd,savings_usd,"
        "unknown_price,unknown_baseline,estimated,estimated_usd,line"
    )
    assert lines[2] == (
        f"2025-03-01,{SMALL},1,100,20,0.000030,0.000120,0.000090,0,0,0,0.000000,usage"
    )
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 5
    assert sum(Decimal(r["cost_usd"]) for r in rows) == report.totals.cost


async def test_cost_resting_on_estimates_is_shown_per_tenant(ledger: SqlLedger) -> None:
    """Rows booked in part from estimated usage are counted and the part of their cost priced
    from estimates summed, per group and in the totals; unknown-priced rows count, add $0."""
    hosted = Attempt("gpt-4o-mini", "stream_cut", 900.0, 230, 41, "cut", estimated=True)
    exact = Attempt(SMALL, "ok", 12.5, 100, 20)
    await ledger.record_many(
        [
            make_entry("e1", cost_micro_usd=80, estimated_micro_usd=59, attempts=(hosted, exact)),
            make_entry("e2", cost_micro_usd=59, estimated_micro_usd=59, attempts=(hosted,)),
            make_entry(
                "e3",
                cost_micro_usd=None,
                price_known=False,
                estimated_micro_usd=0,
                attempts=(hosted,),
            ),
            make_entry("x1", cost_micro_usd=30),
            make_entry("g1", tenant="globex", principal="tenant:globex", cost_micro_usd=40),
        ]
    )
    report = await cost_report(ledger, tenant=None, start=None, end=None, group_by=("tenant",))
    groups = by_group(report)
    acme, globex = groups[("acme",)], groups[("globex",)]
    assert (acme.requests, acme.cost_micro_usd, acme.unknown_price) == (4, 169, 1)
    assert (acme.estimated, acme.estimated_micro_usd) == (3, 118)
    assert acme.estimated_usd == Decimal("0.000118")
    assert (globex.estimated, globex.estimated_micro_usd) == (0, 0)
    assert (report.totals.estimated, report.totals.estimated_micro_usd) == (3, 118)
    data = render_json(report)
    assert (data["rows"][0]["estimated"], data["rows"][0]["estimated_usd"]) == (3, "0.000118")
    assert data["totals"]["estimated_usd"] == "0.000118"
    lines = render_csv(report).splitlines()
    assert lines[1].endswith(",3,0.000118,usage") and lines[2].endswith(",0,0.000000,usage")
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_table(report))
    assert "$0.00012 (3)" in console.file.getvalue()  # type: ignore[attr-defined]


async def test_table_rounds_to_cents(ledger: SqlLedger) -> None:
    await ledger.record(
        make_entry("t1", cost_micro_usd=1_234_567_891, baseline_micro_usd=2_005_000)
    )
    report = await cost_report(ledger, tenant="acme", start=None, end=None)
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_table(report))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "$1,234.57" in out  # cost
    assert "$2.00" in out  # 2.005 rounds half-even to 2.00
    assert "-$1,232.56" in out  # savings
    assert "2025-03-01" in out and "total" in out


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ("0", "$0.00"),
        ("0.000042", "$0.000042"),
        ("0.00000039", "$0.00000039"),
        ("0.0049", "$0.0049"),
        ("0.01", "$0.01"),
        ("1234.567", "$1,234.57"),
        ("-0.000042", "-$0.000042"),
    ],
)
def test_displayed_money_scales_below_a_cent(amount: str, shown: str) -> None:
    assert display_usd(Decimal(amount)) == shown


LONG = "hosted_vllm/meta-llama/Llama-3.1-70B-Instruct-AWQ"


async def test_report_keeps_every_model_name_whole_at_100_columns_and_pipes_full_values(
    ledger: SqlLedger, redis_url: str
) -> None:
    await ledger.record_many(
        [
            make_entry("w1", deployment=LONG, cost_micro_usd=0, cost_nano_usd=390),
            make_entry("w2", cost_micro_usd=42),
        ]
    )
    report = await cost_report(ledger, tenant=None, start=None, end=None)
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(render_table(report, width=100))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in out.splitlines()) <= 100
    assert LONG in out and SMALL in out and str(T0.date()) in out
    assert "$0.00000039" in out and "$0.000042" in out
    assert "…" not in out
    if ledger.dialect != "sqlite":
        return
    url = str(ledger.engine.url)
    env = {"TIERGATE_DATABASE__URL": url, "TIERGATE_REDIS__URL": redis_url}
    piped = await asyncio.to_thread(
        CliRunner().invoke, app, ["report", "--config", str(EXAMPLE)], env=env
    )
    assert piped.exit_code == 0, piped.output
    lines = [line.split("\t") for line in piped.output.splitlines()]
    assert lines[0][:3] == ["day", "model", "requests"]
    assert [T0.date().isoformat(), LONG] in [line[:2] for line in lines[1:]]
    assert "0.00000039" in piped.output and "0.000042" in piped.output
