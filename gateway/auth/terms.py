"""``TenantTerms``: what a tenant is held to once routed — its fair-share weight, rate limits,
budgets and baseline deployment — the same shape for a config-file tenant and a run-time one.

The queue, the rate limiter, the budget book and the executor read them through
``TenantDirectory`` (one in-memory lookup per request), so a run-time tenant's change applies
wherever the directory is reloaded, without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.auth.tenants import TenantProfile
from gateway.limits.rate import TenantRates
from gateway.settings import BudgetSettings, TenantSettings

__all__ = ["TenantTerms", "terms_from_profile", "terms_from_settings"]


@dataclass(frozen=True, slots=True)
class TenantTerms:
    weight: float = 1.0
    rates: TenantRates = field(default_factory=TenantRates)
    budgets: tuple[BudgetSettings, ...] = ()
    baseline_model: str | None = None
    """Deployment the ledger's baseline cost is priced on; ``None``: unknown (rows flagged)."""


class _TenantFields(Protocol):
    """What a config-file tenant (``TenantSettings``) and a run-time one (``TenantProfile``)
    both say of the terms, each field meaning the same in both."""

    @property
    def weight(self) -> float: ...
    @property
    def requests_per_minute(self) -> int | None: ...
    @property
    def tokens_per_minute(self) -> int | None: ...
    @property
    def baseline_model(self) -> str | None: ...


def terms_from_settings(tenant: TenantSettings, default_baseline: str | None) -> TenantTerms:
    return _terms(tenant, tenant.budgets, default_baseline)


def terms_from_profile(profile: TenantProfile, default_baseline: str | None) -> TenantTerms:
    return _terms(profile, profile.all_budgets, default_baseline)


def _terms(
    tenant: _TenantFields, budgets: tuple[BudgetSettings, ...], default_baseline: str | None
) -> TenantTerms:
    """``budgets``: all of them (a profile's ``monthly_budget_usd`` is one)."""
    return TenantTerms(
        weight=tenant.weight,
        rates=TenantRates(tenant.requests_per_minute, tenant.tokens_per_minute),
        budgets=budgets,
        baseline_model=_or(tenant.baseline_model, default_baseline),
    )


def _or(chosen: str | None, default: str | None) -> str | None:
    return default if chosen is None else chosen
