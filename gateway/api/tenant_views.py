"""What the admin API shows of a tenant: its settings as set (in the config file, or at run
time) and ``effective``, what this process holds it to now, read from the live
``TenantDirectory`` the router, queue, limiter, budget book and ledger read.

A config-file tenant's key variable and development key are never shown: its settings are
taken field by field from those a run-time tenant has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.auth.directory import TenantDirectory, prompts_loggable, tenant_priority
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.settings import Settings, TenantSettings
from router.catalog import TenantPolicy, Tier

__all__ = ["config_view", "effective_view", "runtime_view"]

_SHOWN = tuple(f for f in TenantProfile.model_fields if f in TenantSettings.model_fields)
"""The settings a config-file tenant shares with a run-time one (not ``key_env``, ``dev_key``)."""


def effective_view(
    settings: Settings, policies: Mapping[str, TenantPolicy], name: str
) -> dict[str, Any] | None:
    """What ``name`` is held to in this process, defaults filled in (``threshold``: the
    classifier's default, ``baseline_model``: the first large deployment; ``budgets`` include
    the one ``monthly_budget_usd`` stands for); ``None`` if this process holds it to nothing."""
    if not isinstance(policies, TenantDirectory):
        return None
    policy = policies.get(name)
    terms = policies.terms(name)
    if policy is None or terms is None:
        return None
    return {
        "default_tier": policy.default_tier.value,
        "allowed_tiers": [t.value for t in Tier if t in policy.allowed_tiers],
        "allowed_models": None if policy.allowed_models is None else sorted(policy.allowed_models),
        "threshold": policy.threshold,
        "priority": tenant_priority(settings, policies, name),
        "weight": terms.weight,
        "requests_per_minute": terms.rates.requests_per_minute,
        "tokens_per_minute": terms.rates.tokens_per_minute,
        "budgets": [b.model_dump(mode="json") for b in terms.budgets],
        "baseline_model": terms.baseline_model,
        "log_prompts": prompts_loggable(settings, policies, name),
    }


def config_view(
    settings: Settings, policies: Mapping[str, TenantPolicy], name: str
) -> dict[str, Any]:
    written = settings.tenants[name].model_dump(mode="json", include=set(_SHOWN))
    return {
        "name": name,
        "source": "config",
        **{field: written[field] for field in _SHOWN},  # in a run-time tenant's order
        "effective": effective_view(settings, policies, name),
    }


def runtime_view(
    settings: Settings, policies: Mapping[str, TenantPolicy], record: TenantRecord
) -> dict[str, Any]:
    """``effective`` is ``None`` while a config-file tenant of the same name wins over this row,
    or before this process has loaded it."""
    shadowed = isinstance(policies, TenantDirectory) and policies.is_configured(record.name)
    return {
        "name": record.name,
        "source": "runtime",
        **record.profile.model_dump(mode="json"),
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "effective": None if shadowed else effective_view(settings, policies, record.name),
    }
