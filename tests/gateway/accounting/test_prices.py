from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from backends.types import Usage
from gateway.accounting import Price, PriceBook, load_litellm_cost_map, to_micro
from gateway.accounting.prices import LITELLM_COST_MAP_FILE, litellm_version
from gateway.settings import (
    DeploymentSettings,
    PriceSettings,
    ReplicaSettings,
    TenantSettings,
)
from router.catalog import Tier

REPLICA = (ReplicaSettings(url="http://127.0.0.1:1"),)


def vllm(model: str, tier: Tier, price: tuple[str, str] | None = None) -> DeploymentSettings:
    return DeploymentSettings(
        model=model,
        tier=tier,
        replicas=REPLICA,
        price=None
        if price is None
        else PriceSettings(input_per_mtok=Decimal(price[0]), output_per_mtok=Decimal(price[1])),
    )


def external(model: str, litellm_model: str | None = None, **kw: object) -> DeploymentSettings:
    return DeploymentSettings(
        model=model, tier=Tier.EXTERNAL, provider="litellm", litellm_model=litellm_model, **kw
    )


def litellm_json() -> dict[str, dict[str, object]]:
    """The shipped file, read independently of the code under test (plain floats)."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / LITELLM_COST_MAP_FILE
    data: dict[str, dict[str, object]] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_explicit_price_is_exact_per_token() -> None:
    book = PriceBook.from_settings([vllm("small-a", Tier.SMALL, ("0.10", "0.30"))])
    price = book.price_of("small-a")
    assert price == Price(Decimal("0.0000001"), Decimal("0.0000003"), "config")
    cost = book.cost("small-a", Usage(prompt_tokens=1_234_567, completion_tokens=7))
    assert cost == Decimal("0.1234567") + Decimal("0.0000021")


def test_unknown_price_is_none_never_zero() -> None:
    book = PriceBook.from_settings(
        [vllm("self-hosted", Tier.LARGE), external("mystery", "openai/not-a-real-model-xyz")]
    )
    usage = Usage(10, 10)
    assert book.price_of("self-hosted") is None
    assert book.cost("self-hosted", usage) is None
    assert book.cost("mystery", usage) is None
    assert book.cost("not-configured", usage) is None
    charge = book.charge("mystery", usage, baseline="self-hosted")
    assert charge.cost_micro_usd is None and charge.baseline_micro_usd is None
    assert not charge.price_known


def test_litellm_map_gpt_4o_mini_matches_the_shipped_file() -> None:
    book = PriceBook.from_settings([external("gpt-mini", "openai/gpt-4o-mini")])
    entry = litellm_json()["gpt-4o-mini"]
    price = book.price_of("gpt-mini")
    assert price is not None and price.source == f"litellm {litellm_version()}"
    assert price.input_per_token == Decimal(str(entry["input_cost_per_token"]))
    assert price.output_per_token == Decimal(str(entry["output_cost_per_token"]))
    assert isinstance(price.input_per_token, Decimal)
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=1_000_000)
    expected = (
        Decimal(str(entry["input_cost_per_token"])) * 1_000_000
        + Decimal(str(entry["output_cost_per_token"])) * 1_000_000
    )
    assert book.cost("gpt-mini", usage) == expected


def test_litellm_model_defaults_to_model_id() -> None:
    book = PriceBook.from_settings([external("gpt-4o-mini")])
    assert book.price_of("gpt-4o-mini") is not None


def test_explicit_price_overrides_the_map() -> None:
    dep = external(
        "gpt-mini",
        "openai/gpt-4o-mini",
        price=PriceSettings(input_per_mtok=Decimal(1), output_per_mtok=Decimal(2)),
    )
    price = PriceBook.from_settings([dep]).price_of("gpt-mini")
    assert price == Price(Decimal("0.000001"), Decimal("0.000002"), "config")


def test_given_cost_map_with_floats_and_provider_check() -> None:
    cost_map = {
        "acme/model-a": {"input_cost_per_token": 1e-07, "output_cost_per_token": 3e-07},
        "model-b": {
            "input_cost_per_token": 2e-06,
            "output_cost_per_token": 4e-06,
            "litellm_provider": "openai",
        },
        "model-c": {"input_cost_per_token": 2e-06},
    }
    book = PriceBook.from_settings(
        [
            external("a", "acme/model-a"),
            external("b-openai", "openai/model-b"),
            external("b-elsewhere", "azure/model-b"),
            external("c", "model-c"),
        ],
        cost_map,
    )
    assert book.price_of("a") == Price(Decimal("1E-7"), Decimal("3E-7"), "litellm")
    assert book.price_of("b-openai") == Price(Decimal("0.000002"), Decimal("0.000004"), "litellm")
    assert book.price_of("b-elsewhere") is None  # the bare entry is another provider's
    assert book.price_of("c") is None  # half a price is no price


def test_baseline_and_charge() -> None:
    book = PriceBook.from_settings(
        [
            vllm("small-a", Tier.SMALL, ("0.15", "0.60")),
            vllm("large-a", Tier.LARGE, ("3", "15")),
            vllm("large-b", Tier.LARGE, ("2", "10")),
        ]
    )
    assert book.baseline_model() == "large-a"
    assert book.baseline_model(TenantSettings(key_env="K")) == "large-a"
    assert book.baseline_model(TenantSettings(key_env="K", baseline_model="large-b")) == "large-b"
    usage = Usage(prompt_tokens=333, completion_tokens=77)
    charge = book.charge("small-a", usage, baseline="large-a")
    # 333 * 0.15 + 77 * 0.60 = 96.15 micro-USD → 96; 333 * 3 + 77 * 15 = 2154 micro-USD
    assert charge.cost_micro_usd == 96
    assert charge.baseline_micro_usd == 2154
    assert charge.price_known
    # 30 * 0.15 = 4.5 micro-USD and 10 * 0.15 = 1.5 micro-USD: half-even to 4 and 2
    assert book.charge("small-a", Usage(30, 0), baseline=None).cost_micro_usd == 4
    assert book.charge("small-a", Usage(10, 0), baseline=None).cost_micro_usd == 2
    assert to_micro(Decimal("0.0000025")) == 2


def test_cost_map_loads_as_decimal() -> None:
    data = load_litellm_cost_map()
    assert isinstance(data["gpt-4o-mini"]["input_cost_per_token"], Decimal)


def test_reading_the_map_does_not_import_litellm() -> None:
    script = (
        "import sys, time\n"
        "from gateway.accounting.prices import load_litellm_cost_map\n"
        "t = time.perf_counter()\n"
        "data = load_litellm_cost_map()\n"
        "elapsed = time.perf_counter() - t\n"
        "assert 'litellm' not in sys.modules, 'litellm was imported'\n"
        "assert len(data) > 1000\n"
        "print(f'{elapsed:.4f}')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 1.0, f"loading the cost map took {out.stdout}s"


@pytest.mark.parametrize(
    ("per_mtok", "per_token"),
    [("0.15", "0.00000015"), ("3", "0.000003"), ("0", "0"), ("12.345678", "0.000012345678")],
)
def test_per_mtok_division_is_exact(per_mtok: str, per_token: str) -> None:
    price = Price.per_mtok(Decimal(per_mtok), Decimal(per_mtok))
    assert price.input_per_token == Decimal(per_token)
