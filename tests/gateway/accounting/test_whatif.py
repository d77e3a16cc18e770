"""What-if pricing on a real ledger: as routed, all external, all self-hosted (GPU measured)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gateway.accounting import PriceBook, SqlLedger
from gateway.accounting.rollups import rollup_day
from gateway.accounting.whatif import render_what_if, what_if
from gateway.settings import load_settings
from tests.gateway.accounting.apps import EXAMPLE
from tests.gateway.accounting.factories import T0, make_entry

COST_MAP = {
    "gpt-4o-mini": {
        "litellm_provider": "openai",
        "input_cost_per_token": Decimal("0.00000015"),
        "output_cost_per_token": Decimal("0.0000006"),
    }
}
LARGE = "llama-3.1-70b-instruct-awq"
ROWS = [
    make_entry("w1", prompt_tokens=600_000, completion_tokens=100_000, cost_micro_usd=24_000),
    make_entry("w2", prompt_tokens=400_000, completion_tokens=400_000, cost_micro_usd=36_000),
    make_entry(
        "w3",
        tenant="globex",
        principal="tenant:globex",
        deployment=LARGE,
        prompt_tokens=1_000_000,
        completion_tokens=0,
        cost_micro_usd=350_000,
    ),
]


def _by_name(result: Any) -> dict[str, Any]:
    return {s.name: s for s in result.scenarios}


async def test_three_scenarios_with_explicit_prices(ledger: SqlLedger) -> None:
    await ledger.record_many(ROWS)
    deployments = load_settings(EXAMPLE).deployments
    prices = PriceBook.from_settings(deployments, cost_map=COST_MAP)
    result = await what_if(ledger, prices, deployments, tenant="acme", start=None, end=None)
    got = _by_name(result)
    assert got["as_routed"].cost == Decimal("0.060000")
    # 1M prompt + 0.5M completion tokens on gpt-4o-mini: 0.15 + 0.30.
    assert (got["all_external"].model, got["all_external"].cost) == ("gpt-4o-mini", Decimal("0.45"))
    # the same on the 70B at its explicit $0.35 / $0.70 per Mtok.
    assert got["all_self_hosted"].cost == Decimal("0.70")
    assert got["all_self_hosted"].rate_source == "config"
    assert render_what_if(result)["scenarios"][1]["cost_usd"] == "0.450000"


async def test_self_hosted_at_measured_utilisation(ledger: SqlLedger) -> None:
    await ledger.record_many(ROWS)
    data = load_settings(EXAMPLE).model_dump(mode="json")
    data["deployments"][1]["gpu_hourly_usd"] = "2.00"
    deployments = load_settings(None, **data).deployments
    prices = PriceBook.from_settings(deployments, cost_map=COST_MAP)
    # The 70B pool (1 replica x 1 GPU x $2/h) ran all day and served 1M tokens: $48 / 1M tokens.
    await rollup_day(
        ledger, T0.date(), gpu={LARGE: Decimal(2)}, now=datetime(2025, 4, 1, tzinfo=UTC)
    )
    result = await what_if(ledger, prices, deployments, tenant="acme", start=None, end=None)
    hosted = _by_name(result)["all_self_hosted"]
    assert hosted.rate_source == "gpu-measured"
    assert hosted.cost == Decimal("72.000000")  # 1.5M tokens x $48 per 1M
    # All tenants: as routed includes the 70B's idle time too ($48 paid, $0.35 booked), as the
    # measured all-self-hosted rate does; each scenario says what it includes.
    everyone = _by_name(
        await what_if(ledger, prices, deployments, tenant=None, start=None, end=None)
    )
    assert everyone["as_routed"].cost == Decimal("0.41") + Decimal("47.65")
    assert "GPU true-up" in everyone["as_routed"].includes
    assert "idle included" in everyone["all_self_hosted"].includes
