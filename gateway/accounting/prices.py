"""Per-token prices of every deployment, and what a request costs.

Prices are data, fixed at start-up: an explicit ``price`` in a deployment's settings wins; an
external (``litellm``) deployment without one takes litellm's model cost map, read from the JSON
file inside the installed litellm package (``import litellm`` takes seconds; reading the file takes
milliseconds). A model with neither has an unknown price: ``cost`` returns ``None`` and the ledger
flags the row, never books it as zero.

A self-hosted deployment with ``gpu_hourly_usd`` is priced at its pool's rate for the pricing
period the request was received in (``gateway.accounting.gpu_rates``): fixed for the period,
published a period ahead, read from Redis with ``ensure_rates`` and kept here.

Each price says where it came from (``Price.source``), and the ledger row keeps it: ``config``,
``litellm <version>`` (the cost map of that litellm release) or the GPU rate's id, basis and
window.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

from backends.types import Usage
from gateway.accounting.gpu_rates import GpuPool, GpuRate, GpuRates
from gateway.accounting.records import to_micro
from gateway.settings import DeploymentSettings, TenantSettings
from router.catalog import Tier

__all__ = [
    "LITELLM_COST_MAP_FILE",
    "Charge",
    "GpuCost",
    "Price",
    "PriceBook",
    "load_litellm_cost_map",
]

log = logging.getLogger(__name__)

LITELLM_COST_MAP_FILE = "model_prices_and_context_window_backup.json"
_PER_MTOK_EXP = -6


@dataclass(frozen=True, slots=True)
class Price:
    """USD per token, exact."""

    input_per_token: Decimal
    output_per_token: Decimal
    source: str = "config"
    """Where it comes from: ``config``, ``litellm <version>`` (the cost map), or a GPU rate
    (``GpuRate.source``: its id, basis and window)."""

    @classmethod
    def per_mtok(cls, input_usd: Decimal, output_usd: Decimal, source: str = "config") -> Price:
        """From USD per million tokens (the settings' unit); the division is exact."""
        return cls(input_usd.scaleb(_PER_MTOK_EXP), output_usd.scaleb(_PER_MTOK_EXP), source)

    def cost(self, usage: Usage) -> Decimal:
        return (
            self.input_per_token * usage.prompt_tokens
            + self.output_per_token * usage.completion_tokens
        )


@dataclass(frozen=True, slots=True)
class GpuCost:
    """A self-hosted pool's cost: ``hourly_usd`` for the whole pool (GPU $/h x GPUs per replica
    x replicas), and the price to use while its throughput is unknown."""

    hourly_usd: Decimal
    fallback: Price | None = None


@dataclass(frozen=True, slots=True)
class Charge:
    """What one request books: ``LedgerEntry`` money fields, in micro-dollars."""

    cost_micro_usd: int | None
    baseline_micro_usd: int | None

    @property
    def price_known(self) -> bool:
        return self.cost_micro_usd is not None


def load_litellm_cost_map() -> dict[str, Any]:
    """litellm's cost map as shipped in the installed package, floats parsed as ``Decimal``.

    ``find_spec`` of a top-level package locates it without running its ``__init__``. Returns an
    empty map (and logs) when litellm is not installed or ships no such file.
    """
    spec = importlib.util.find_spec("litellm")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for location in locations:
        path = Path(location) / LITELLM_COST_MAP_FILE
        if path.is_file():
            data = json.loads(path.read_bytes(), parse_float=Decimal)
            if isinstance(data, dict):
                return data
    log.warning("litellm's cost map %s not found: external prices unknown", LITELLM_COST_MAP_FILE)
    return {}


def _decimal(value: object) -> Decimal | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int | float | str):
        try:
            return Decimal(str(value))
        except ArithmeticError:
            return None
    return None


def litellm_version() -> str:
    """The installed litellm's version (whose cost map prices external deployments)."""
    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _from_cost_map(
    dep: DeploymentSettings, cost_map: Mapping[str, Any], source: str = "litellm"
) -> Price | None:
    for key, provider in _cost_map_keys(dep):
        entry = cost_map.get(key)
        if not isinstance(entry, Mapping):
            continue
        if provider is not None and entry.get("litellm_provider", provider) != provider:
            continue
        input_cost = _decimal(entry.get("input_cost_per_token"))
        output_cost = _decimal(entry.get("output_cost_per_token"))
        if input_cost is not None and output_cost is not None:
            return Price(input_cost, output_cost, source=source)
    return None


def _cost_map_keys(dep: DeploymentSettings) -> list[tuple[str, str | None]]:
    """Keys to try, each with the provider its entry must name: ``openai/gpt-4o-mini`` as is,
    then ``gpt-4o-mini`` if that entry is ``openai``'s; then the deployment's model id alike."""
    keys: list[tuple[str, str | None]] = []
    for name in (dep.litellm_model, dep.model):
        if not name:
            continue
        keys.append((name, None))
        provider, sep, bare = name.partition("/")
        if sep and bare:
            keys.append((bare, provider))
    return list(dict.fromkeys(keys))


class PriceBook:
    """Every deployment's price, by model id; ``None`` where the price is unknown. GPU-priced
    pools are priced at the rate of the request's pricing period (``ensure_rates`` reads them
    from ``GpuRates``; ``attach_rates`` gives the book its source)."""

    __slots__ = ("_default_baseline", "_gpu", "_limits", "_pools", "_prices", "_rates", "_source")

    def __init__(
        self,
        prices: Mapping[str, Price | None],
        *,
        default_baseline: str | None = None,
        gpu: Mapping[str, GpuCost] | None = None,
        pools: Sequence[GpuPool] = (),
        output_limits: Mapping[str, int] | None = None,
    ) -> None:
        self._prices: Mapping[str, Price | None] = MappingProxyType(dict(prices))
        self._default_baseline = default_baseline
        self._gpu: Mapping[str, GpuCost] = MappingProxyType(dict(gpu or {}))
        self._pools: Mapping[str, GpuPool] = MappingProxyType({p.deployment: p for p in pools})
        self._limits: Mapping[str, int] = MappingProxyType(dict(output_limits or {}))
        self._rates: dict[tuple[str, int], GpuRate] = {}
        self._source: GpuRates | None = None

    @classmethod
    def from_settings(
        cls,
        deployments: Sequence[DeploymentSettings],
        cost_map: Mapping[str, Any] | None = None,
    ) -> PriceBook:
        """Explicit prices first; litellm deployments without one look in ``cost_map`` (default:
        the installed litellm's file, read once, only if some deployment needs it)."""
        needs_map = any(d.price is None and d.provider == "litellm" for d in deployments)
        map_source = "litellm"
        if cost_map is None and needs_map:
            cost_map = load_litellm_cost_map()
            map_source = f"litellm {litellm_version()}"
        prices: dict[str, Price | None] = {}
        gpu: dict[str, GpuCost] = {}
        pools: list[GpuPool] = []
        for dep in deployments:
            price: Price | None = None
            if dep.price is not None:
                price = Price.per_mtok(dep.price.input_per_mtok, dep.price.output_per_mtok)
            elif dep.provider == "litellm" and cost_map is not None:
                price = _from_cost_map(dep, cost_map, map_source)
            if dep.gpu_hourly_usd is not None:
                replica_hourly = dep.gpu_hourly_usd * dep.gpus_per_replica
                replicas = max(1, len(dep.replicas))
                gpu[dep.model] = GpuCost(replica_hourly * replicas, fallback=price)
                pools.append(
                    GpuPool(
                        deployment=dep.model,
                        replica_hourly_usd=replica_hourly,
                        replicas=replicas,
                        period_s=dep.gpu_rate_period_s,
                        expected_tokens_per_s=dep.gpu_expected_tokens_per_s,
                        min_per_token=_per_token(dep.gpu_rate_min_per_mtok),
                        max_per_token=_per_token(dep.gpu_rate_max_per_mtok),
                        fallback_input=None if price is None else price.input_per_token,
                        fallback_output=None if price is None else price.output_per_token,
                    )
                )
            elif price is None:
                log.warning("deployment %r has no known price; its requests are flagged", dep.model)
            prices[dep.model] = price
        large = next((d.model for d in deployments if d.tier is Tier.LARGE), None)
        return cls(
            prices,
            default_baseline=large,
            gpu=gpu,
            pools=pools,
            output_limits={d.model: d.max_model_len for d in deployments},
        )

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """Deployments priced from GPU cost (``gateway.accounting.gpu_rates``)."""
        return tuple(self._gpu)

    @property
    def gpu_pools(self) -> tuple[GpuPool, ...]:
        return tuple(self._pools.values())

    def gpu_cost(self, model: str) -> GpuCost | None:
        return self._gpu.get(model)

    def attach_rates(self, rates: GpuRates) -> None:
        """Where ``ensure_rates`` reads the GPU pools' published rates from."""
        self._source = rates

    async def ensure_rates(self, at: float | None = None) -> None:
        """Read the rates of the period of ``at`` (default: now) and of the next one, for every
        GPU pool, unless already kept (Redis errors propagate). Cheap when they are."""
        if self._source is None or not self._pools:
            return
        now = time.time() if at is None else at
        for name, pool in self._pools.items():
            period = pool.period(now)
            for p in (period, period + 1):
                if (name, p) not in self._rates:
                    rate = await self._source.rate(name, p)
                    if rate is not None:
                        self._rates[(name, p)] = rate
            for key in [k for k in self._rates if k[0] == name and k[1] < period - 4]:
                del self._rates[key]

    def gpu_rate(self, model: str, at: float | None = None) -> GpuRate | None:
        """The kept rate of ``model`` for the period of ``at`` (``None``: not read yet)."""
        pool = self._pools.get(model)
        if pool is None:
            return None
        return self._rates.get((model, pool.period(time.time() if at is None else at)))

    def output_limit(self, model: str) -> int:
        """The most output tokens a call to ``model`` can produce (its context length)."""
        return self._limits.get(model, 1 << 31)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._prices)

    def price_of(self, model: str, at: float | None = None) -> Price | None:
        """``model``'s price for a request received at ``at`` (default: now)."""
        rate = self.gpu_rate(model, at)
        if rate is not None:
            if rate.input_per_token is None or rate.output_per_token is None:
                return None
            return Price(rate.input_per_token, rate.output_per_token, source=rate.source)
        return self._prices.get(model)

    def source(self, model: str, at: float | None = None) -> str | None:
        """Where ``model``'s price at ``at`` comes from (``Price.source``; ``None``: unknown)."""
        price = self.price_of(model, at)
        return None if price is None else price.source

    def cost(self, model: str, usage: Usage, at: float | None = None) -> Decimal | None:
        """USD for ``usage`` on ``model``; ``None`` when the price is unknown (never zero)."""
        price = self.price_of(model, at)
        return None if price is None else price.cost(usage)

    def baseline_model(self, tenant: TenantSettings | None = None) -> str | None:
        """The tenant's reference deployment: its ``baseline_model``, else the first large one."""
        if tenant is not None and tenant.baseline_model is not None:
            return tenant.baseline_model
        return self._default_baseline

    def charge(
        self, model: str | None, usage: Usage, *, baseline: str | None, at: float | None = None
    ) -> Charge:
        """Cost of ``usage`` on ``model`` and on ``baseline``, as ledger micro-dollars."""
        cost = None if model is None else self.cost(model, usage, at)
        base = None if baseline is None else self.cost(baseline, usage, at)
        return Charge(
            cost_micro_usd=None if cost is None else to_micro(cost),
            baseline_micro_usd=None if base is None else to_micro(base),
        )


def _per_token(per_mtok: Decimal | None) -> Decimal | None:
    return None if per_mtok is None else per_mtok.scaleb(_PER_MTOK_EXP)
