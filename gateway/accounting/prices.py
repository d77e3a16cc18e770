"""Per-token prices of every deployment, and what a request costs.

Prices are data, fixed at start-up: an explicit ``price`` in a deployment's settings wins; an
external (``litellm``) deployment without one takes litellm's model cost map, read from the JSON
file inside the installed litellm package (``import litellm`` takes seconds; reading the file takes
milliseconds). A model with neither has an unknown price: ``cost`` returns ``None`` and the ledger
flags the row, never books it as zero.

A self-hosted deployment with ``gpu_hourly_usd`` is priced from what its pool costs and what it
does: per-token rate = pool $/h ÷ (3600 x pool tokens/s over a rolling window), the same rate for
input and output tokens (the window counts both). The throughput is measured across processes
(``ThroughputMeter``, Redis) and handed in with ``update_throughput``; until there is any, the
deployment's explicit ``price`` applies (or the price is unknown and flagged).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

from backends.types import Usage
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
    source: str = "settings"
    """``settings`` or ``litellm`` (the cost map)."""

    @classmethod
    def per_mtok(cls, input_usd: Decimal, output_usd: Decimal, source: str = "settings") -> Price:
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

    def price_at(self, tokens_per_s: float) -> Price:
        """Per-token price at ``tokens_per_s`` pool throughput (input and output alike)."""
        if tokens_per_s <= 0:
            raise ValueError("throughput must be positive")
        per_token = self.hourly_usd / (Decimal(3600) * Decimal(repr(tokens_per_s)))
        return Price(per_token, per_token, source="gpu")


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


def _from_cost_map(dep: DeploymentSettings, cost_map: Mapping[str, Any]) -> Price | None:
    for key, provider in _cost_map_keys(dep):
        entry = cost_map.get(key)
        if not isinstance(entry, Mapping):
            continue
        if provider is not None and entry.get("litellm_provider", provider) != provider:
            continue
        input_cost = _decimal(entry.get("input_cost_per_token"))
        output_cost = _decimal(entry.get("output_cost_per_token"))
        if input_cost is not None and output_cost is not None:
            return Price(input_cost, output_cost, source="litellm")
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
    """Every deployment's price, by model id; ``None`` where the price is unknown."""

    __slots__ = ("_default_baseline", "_gpu", "_measured", "_prices")

    def __init__(
        self,
        prices: Mapping[str, Price | None],
        *,
        default_baseline: str | None = None,
        gpu: Mapping[str, GpuCost] | None = None,
    ) -> None:
        self._prices: Mapping[str, Price | None] = MappingProxyType(dict(prices))
        self._default_baseline = default_baseline
        self._gpu: Mapping[str, GpuCost] = MappingProxyType(dict(gpu or {}))
        self._measured: dict[str, Price] = {}

    @classmethod
    def from_settings(
        cls,
        deployments: Sequence[DeploymentSettings],
        cost_map: Mapping[str, Any] | None = None,
    ) -> PriceBook:
        """Explicit prices first; litellm deployments without one look in ``cost_map`` (default:
        the installed litellm's file, read once, only if some deployment needs it)."""
        needs_map = any(d.price is None and d.provider == "litellm" for d in deployments)
        if cost_map is None and needs_map:
            cost_map = load_litellm_cost_map()
        prices: dict[str, Price | None] = {}
        gpu: dict[str, GpuCost] = {}
        for dep in deployments:
            price: Price | None = None
            if dep.price is not None:
                price = Price.per_mtok(dep.price.input_per_mtok, dep.price.output_per_mtok)
            elif dep.provider == "litellm" and cost_map is not None:
                price = _from_cost_map(dep, cost_map)
            if dep.gpu_hourly_usd is not None:
                pool = dep.gpu_hourly_usd * dep.gpus_per_replica * max(1, len(dep.replicas))
                gpu[dep.model] = GpuCost(pool, fallback=price)
            elif price is None:
                log.warning("deployment %r has no known price; its requests are flagged", dep.model)
            prices[dep.model] = price
        large = next((d.model for d in deployments if d.tier is Tier.LARGE), None)
        return cls(prices, default_baseline=large, gpu=gpu)

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """Deployments priced from GPU cost and measured throughput."""
        return tuple(self._gpu)

    def gpu_cost(self, model: str) -> GpuCost | None:
        return self._gpu.get(model)

    def update_throughput(self, tokens_per_s: Mapping[str, float | None]) -> None:
        """Re-derive GPU-priced deployments' prices from measured pool throughput; ``None``
        (no history) returns a deployment to its fallback price."""
        for model, rate in tokens_per_s.items():
            cost = self._gpu.get(model)
            if cost is None:
                continue
            if rate is None or rate <= 0:
                self._measured.pop(model, None)
            else:
                self._measured[model] = cost.price_at(rate)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._prices)

    def price_of(self, model: str) -> Price | None:
        measured = self._measured.get(model)
        return measured if measured is not None else self._prices.get(model)

    def cost(self, model: str, usage: Usage) -> Decimal | None:
        """USD for ``usage`` on ``model``; ``None`` when the price is unknown (never zero)."""
        price = self.price_of(model)
        return None if price is None else price.cost(usage)

    def baseline_model(self, tenant: TenantSettings | None = None) -> str | None:
        """The tenant's reference deployment: its ``baseline_model``, else the first large one."""
        if tenant is not None and tenant.baseline_model is not None:
            return tenant.baseline_model
        return self._default_baseline

    def charge(self, model: str | None, usage: Usage, *, baseline: str | None) -> Charge:
        """Cost of ``usage`` on ``model`` and on ``baseline``, as ledger micro-dollars."""
        cost = None if model is None else self.cost(model, usage)
        base = None if baseline is None else self.cost(baseline, usage)
        return Charge(
            cost_micro_usd=None if cost is None else to_micro(cost),
            baseline_micro_usd=None if base is None else to_micro(base),
        )
