"""What-if: the same period's tokens priced three ways — as routed, entirely on the external API,
and entirely on the self-hosted large pool at its measured utilisation.

Every scenario is the whole cost of serving the period's tokens, idle GPU time included, so
the three compare like with like (each says what it includes, ``Scenario.includes``):

- **as routed**: what the ledger booked (rows with an unknown price are counted, not priced),
  plus the GPU true-up of the period (the GPU-priced pools' recorded cost beyond what their
  rows booked: idle time), as the cost report shows it.
- **external**: every row's prompt and completion tokens at the external deployment's price
  (default: the first ``external`` deployment with a known price).
- **self-hosted**: the same tokens at the self-hosted pool's effective rate (default: the first
  ``large`` vLLM deployment). For a GPU-priced pool the effective rate is what the pool cost over
  the period's GPU true-ups (hours paid, idle included) divided by the tokens it served then — its
  measured utilisation; without true-ups (or for an explicitly priced pool) its current price.
  Moving all traffic there would raise utilisation, so this is an upper bound for the pool's
  share of the cost, at today's fleet size.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from sqlalchemy import func, select

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import Price, PriceBook
from gateway.accounting.records import MICRO, to_micro
from gateway.accounting.reports import CostSums, cost_report
from gateway.accounting.schema import gpu_trueup
from gateway.settings import DeploymentSettings
from router.catalog import Tier

__all__ = ["Scenario", "WhatIf", "effective_gpu_price", "render_what_if", "what_if"]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    model: str | None
    cost_micro_usd: int | None
    """``None`` when the scenario's price is unknown."""
    rate_source: str
    includes: str = ""
    """Which costs the figure includes, in words (shown with it)."""

    @property
    def cost(self) -> Decimal | None:
        return None if self.cost_micro_usd is None else Decimal(self.cost_micro_usd) * MICRO


@dataclass(frozen=True, slots=True)
class WhatIf:
    tenant: str | None
    start: date | None
    end: date | None
    totals: CostSums
    scenarios: tuple[Scenario, ...]


async def effective_gpu_price(
    ledger: SqlLedger, model: str, start: date | None, end: date | None
) -> Price | None:
    """Pool cost ÷ tokens served over the period's true-ups (all tenants), or ``None``."""
    t = gpu_trueup.c
    per_day = (
        select(t.day, func.max(t.pool_paid_micro_usd).label("paid"), func.sum(t.tokens).label("n"))
        .where(t.deployment == model)
        .group_by(t.day)
    )
    if start is not None:
        per_day = per_day.where(t.day >= start)
    if end is not None:
        per_day = per_day.where(t.day <= end)
    sub = per_day.subquery()
    query = select(func.coalesce(func.sum(sub.c.paid), 0), func.coalesce(func.sum(sub.c.n), 0))
    async with ledger.engine.connect() as conn:
        paid, tokens = (await conn.execute(query)).one()
    if not tokens:
        return None
    rate = Decimal(int(paid)) * MICRO / int(tokens)
    return Price(rate, rate, source="gpu-measured")


def _pick(deployments: tuple[DeploymentSettings, ...], prices: PriceBook, tier: Tier) -> str | None:
    """The first deployment of ``tier`` that can stand for it: a priced external one, or a
    self-hosted (vLLM) one."""
    for d in deployments:
        if d.tier is not tier:
            continue
        priced = prices.price_of(d.model) is not None
        if (tier is Tier.EXTERNAL and priced) or (
            tier is not Tier.EXTERNAL and d.provider == "vllm"
        ):
            return d.model
    return None


def _scenario(
    name: str, model: str | None, price: Price | None, sums: CostSums, includes: str
) -> Scenario:
    if model is None or price is None:
        return Scenario(name, model, None, "unknown", includes)
    cost = (
        price.input_per_token * sums.prompt_tokens + price.output_per_token * sums.completion_tokens
    )
    return Scenario(name, model, to_micro(cost), price.source, includes)


async def what_if(
    ledger: SqlLedger,
    prices: PriceBook,
    deployments: tuple[DeploymentSettings, ...],
    *,
    tenant: str | None,
    start: date | None,
    end: date | None,
    external: str | None = None,
    self_hosted: str | None = None,
) -> WhatIf:
    report = await cost_report(ledger, tenant=tenant, start=start, end=end, group_by=())
    sums = report.totals
    external = external or _pick(deployments, prices, Tier.EXTERNAL)
    self_hosted = self_hosted or _pick(deployments, prices, Tier.LARGE)
    hosted_price = None
    if self_hosted is not None:
        if prices.gpu_cost(self_hosted) is not None:
            hosted_price = await effective_gpu_price(ledger, self_hosted, start, end)
        hosted_price = hosted_price or prices.price_of(self_hosted)
    trueup = to_micro(report.trueup_usd)
    routed = Scenario(
        "as_routed",
        None,
        to_micro(sums.cost) + trueup,
        "ledger",
        "every row at its booked price, plus the GPU true-up of the period "
        f"(idle GPU time: ${report.trueup_usd})"
        if report.trueup
        else "every row at its booked price (no GPU-priced pool trued up in the period)",
    )
    measured = hosted_price is not None and hosted_price.source == "gpu-measured"
    return WhatIf(
        tenant=tenant,
        start=start,
        end=end,
        totals=sums,
        scenarios=(
            routed,
            _scenario(
                "all_external",
                external,
                None if external is None else prices.price_of(external),
                sums,
                "every token at the external provider's price (no GPU cost: the pools idle down)",
            ),
            _scenario(
                "all_self_hosted",
                self_hosted,
                hosted_price,
                sums,
                "every token at the pool's measured cost per token: GPU hours paid, idle "
                "included, over the tokens served"
                if measured
                else "every token at the pool's configured price (no measured GPU hours)",
            ),
        ),
    )


def render_what_if(result: WhatIf) -> dict[str, object]:
    """JSON-ready; money as 6-decimal strings."""
    return {
        "tenant": result.tenant,
        "start": None if result.start is None else result.start.isoformat(),
        "end": None if result.end is None else result.end.isoformat(),
        "requests": result.totals.requests,
        "prompt_tokens": result.totals.prompt_tokens,
        "completion_tokens": result.totals.completion_tokens,
        "unknown_price": result.totals.unknown_price,
        "scenarios": [
            {
                "name": s.name,
                "model": s.model,
                "cost_usd": None if s.cost is None else f"{s.cost.quantize(MICRO):f}",
                "rate_source": s.rate_source,
                "includes": s.includes,
            }
            for s in result.scenarios
        ],
    }
