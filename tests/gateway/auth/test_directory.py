"""``TenantDirectory``'s terms (weight, rate limits, budgets, baseline) for config-file and
run-time tenants, and the run-time profile that carries them: pure, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gateway.accounting import PriceBook
from gateway.api.tenant_views import config_view, effective_view, runtime_view
from gateway.auth.directory import TenantDirectory
from gateway.auth.tenant_changes import TenantChanges
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.errors import InvalidRequest
from gateway.limits.rate import TenantRates
from gateway.services import build_policies, build_terms
from gateway.settings import BudgetSettings, Settings, load_settings
from tests.gateway.auth.conftest import EXAMPLE

LARGE = "llama-3.1-70b-instruct-awq"
SMALL = "llama-3.1-8b-instruct"
NOW = datetime(2025, 3, 14, tzinfo=UTC)


def _settings() -> Settings:
    acme = {
        "key_env": "K",
        "weight": 3.0,
        "requests_per_minute": 10,
        "budgets": [{"name": "m", "limit_usd": "5"}],
    }
    return load_settings(EXAMPLE, tenants={"acme": acme, "globex": {"key_env": "G"}})


def _directory(settings: Settings) -> TenantDirectory:
    prices = PriceBook.from_settings(settings.deployments, cost_map={})
    return TenantDirectory(
        build_policies(settings, 0.5),
        0.5,
        fixed_terms=build_terms(settings, prices),
        default_baseline=prices.baseline_model(),
    )


def _records(**profiles: dict[str, Any]) -> dict[str, TenantRecord]:
    return {
        name: TenantRecord(name, TenantProfile.model_validate(p), NOW, NOW)
        for name, p in profiles.items()
    }


def test_config_tenants_keep_their_settings() -> None:
    directory = _directory(_settings())
    assert directory.weights["acme"] == 3.0 and directory.weights["globex"] == 1.0
    assert directory.rates["acme"] == TenantRates(requests_per_minute=10)
    assert directory.rates["globex"] == TenantRates()
    assert [b.name for b in directory.budgets["acme"]] == ["m"]
    assert directory.budgets["globex"] == ()
    assert directory.baselines["globex"] == LARGE  # the first large deployment


def test_run_time_tenants_get_their_profile_and_the_defaults() -> None:
    directory = _directory(_settings())
    directory.replace(
        _records(
            umbrella={
                "weight": 2.5,
                "requests_per_minute": 60,
                "tokens_per_minute": 9000,
                "baseline_model": SMALL,
                "budgets": [{"name": "bot", "limit_usd": "1", "app": "bot", "mode": "soft"}],
                "monthly_budget_usd": "20",
            },
            plain={},
        )
    )
    assert directory.weights["umbrella"] == 2.5
    assert directory.rates["umbrella"] == TenantRates(60, 9000)
    assert directory.baselines["umbrella"] == SMALL
    bot, monthly = directory.budgets["umbrella"]
    assert (bot.name, bot.mode, bot.app) == ("bot", "soft", "bot")
    assert monthly == BudgetSettings(name="monthly", limit_usd=Decimal(20), window="month")
    assert monthly.mode == "hard"
    # nothing set: as a config-file tenant with nothing set
    assert directory.weights["plain"] == 1.0
    assert directory.rates["plain"] == TenantRates()
    assert directory.budgets["plain"] == ()
    assert directory.baselines["plain"] == LARGE


def test_views_follow_every_reload_and_config_tenants_win() -> None:
    directory = _directory(_settings())
    rates, weights = directory.rates, directory.weights  # taken once, as the services do
    directory.replace(_records(umbrella={"requests_per_minute": 2}, acme={"weight": 9}))
    assert rates["umbrella"].requests_per_minute == 2
    assert weights["acme"] == 3.0  # the config file's acme, not the SQL row of the same name
    directory.replace(_records(umbrella={"requests_per_minute": 600}))
    assert rates["umbrella"].requests_per_minute == 600
    directory.replace({})
    assert "umbrella" not in rates and weights.get("umbrella", 1.0) == 1.0
    assert set(weights) == {"acme", "globex"} and len(rates) == 2


def test_old_stored_profiles_load() -> None:
    # as written before weights, rate limits, budgets and baselines existed
    old = {
        "default_tier": "small",
        "allowed_tiers": ["small", "large"],
        "allowed_models": None,
        "threshold": 0.4,
        "priority": "batch",
        "monthly_budget_usd": "250.00",
        "log_prompts": False,
    }
    profile = TenantProfile.from_stored(old)
    assert profile.weight == 1.0 and profile.budgets == () and profile.baseline_model is None
    assert profile.requests_per_minute is None and profile.tokens_per_minute is None
    assert [(b.name, b.limit_usd, b.mode) for b in profile.all_budgets] == [
        ("monthly", Decimal(250), "hard")
    ]
    # a zero was accepted (and meant nothing) then; it still means nothing
    assert TenantProfile.from_stored({**old, "monthly_budget_usd": "0"}).all_budgets == ()


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"budgets": [{"name": "m", "limit_usd": "0"}]}, "budgets"),
        ({"budgets": [{"name": "m", "limit_usd": "1", "window": "week"}]}, "budgets"),
        ({"budgets": [{"name": "m", "limit_usd": "1", "colour": "red"}]}, "budgets"),
        ({"budgets": [{"name": "m", "limit_usd": "1"}, {"name": "m", "limit_usd": "2"}]}, None),
        ({"budgets": [{"name": "monthly", "limit_usd": "1"}], "monthly_budget_usd": "5"}, None),
        ({"monthly_budget_usd": "0"}, "monthly_budget_usd"),
        ({"weight": 0}, "weight"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
    ],
)
def test_bad_settings_are_refused(changes: dict[str, Any], param: str | None) -> None:
    with pytest.raises(InvalidRequest) as refused:
        TenantProfile().merged(changes)
    assert refused.value.param == param
    assert refused.value.message.startswith("invalid tenant settings: ")


def test_named_deployments_are_checked() -> None:
    known = [SMALL, LARGE]
    assert (
        TenantProfile(baseline_model=LARGE, allowed_models=(SMALL,)).unknown_deployment(known)
        is None
    )
    assert TenantProfile(baseline_model="gpt-9").unknown_deployment(known) == (
        "baseline_model",
        "unknown deployment 'gpt-9'",
    )
    assert TenantProfile(allowed_models=("x",)).unknown_deployment(known) == (
        "allowed_models",
        "unknown deployments ['x']",
    )


def test_null_in_a_change_puts_the_default_back() -> None:
    set_ = TenantProfile(weight=2, requests_per_minute=9, budgets=(), priority="batch")
    assert set_.merged({"weight": None, "requests_per_minute": None}) == TenantProfile(
        priority="batch"
    )
    with pytest.raises(InvalidRequest) as refused:
        set_.merged({"colour": None})
    assert refused.value.param == "colour"


def test_changes_name_exactly_the_profile_fields() -> None:
    assert list(TenantChanges.model_fields) == list(TenantProfile.model_fields)
    change = TenantChanges.model_validate(
        {"weight": "2", "threshold": None, "budgets": [{"name": "m", "limit_usd": 1}]}
    )
    assert change.given() == {
        "weight": 2.0,
        "threshold": None,
        "budgets": [
            {
                "name": "m",
                "limit_usd": "1",
                "window": "month",
                "mode": "hard",
                "app": None,
                "tag": None,
                "alert_at": [0.5, 0.8, 1.0],
                "webhook_url_env": None,
            }
        ],
    }
    assert TenantChanges().given() == {}


def test_admin_views_read_the_directory() -> None:
    settings = _settings()
    directory = _directory(settings)
    records = _records(acme={"weight": 9}, umbrella={"weight": 2})
    acme_row, umbrella = records["acme"], records["umbrella"]
    assert runtime_view(settings, directory, umbrella)["effective"] is None  # not loaded yet
    directory.replace(records)
    assert runtime_view(settings, directory, umbrella)["effective"]["weight"] == 2.0
    assert runtime_view(settings, directory, acme_row)["effective"] is None  # the config's wins
    acme = config_view(settings, directory, "acme")
    assert acme["effective"]["weight"] == 3.0 and acme["effective"]["requests_per_minute"] == 10
    assert acme["effective"]["baseline_model"] == LARGE and "key_env" not in acme
    assert effective_view(settings, {}, "acme") is None  # not a directory: nothing to show
