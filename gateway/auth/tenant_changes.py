"""``TenantChanges``: a change to some of a run-time tenant's settings — the body of
``PATCH /v1/admin/tenants/{name}`` and what ``tiergate tenants update`` sends.

Each field is a ``TenantProfile`` field of the same name and type. A field left out keeps its
value; a field given a value takes it (a list replaces the whole list); a field given ``null``
goes back to its default — unset for ``allowed_models``, ``threshold``, ``baseline_model``, the
rate limits and ``monthly_budget_usd``, and ``TenantProfile``'s default for the others (weight
1, no budgets, every tier, …). Unknown fields are refused. What depends on the whole profile
(budget names unique, ``monthly`` included) is checked when the change is merged
(``TenantProfile.merged``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gateway.auth.tenants import LimitUsd, PerMinute, Priority, Threshold, Weight
from gateway.settings import BudgetSettings
from router.catalog import Tier

__all__ = ["TenantChanges"]


class TenantChanges(BaseModel):
    """Some of a tenant's settings: a field left out is kept, ``null`` puts it back to its
    default."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        json_schema_extra={
            "examples": [
                {"requests_per_minute": 1200, "weight": 2},
                {"budgets": [{"name": "monthly", "limit_usd": "500"}], "threshold": None},
            ]
        },
    )

    default_tier: Tier | None = None
    """Where a request goes when routing has no opinion; null: small."""
    allowed_tiers: tuple[Tier, ...] | None = None
    """Tiers the tenant may use; null: every tier."""
    allowed_models: tuple[str, ...] | None = None
    """Deployments it may name directly; null: every deployment of its allowed tiers."""
    threshold: Threshold | None = None
    """Classifier score at or above which auto goes large; null: the model's default."""
    baseline_model: str | None = None
    """Deployment pricing the ledger's baseline cost; null: the first large deployment."""
    priority: Priority | None = None
    """Default queue lane; null: standard."""
    weight: Weight | None = None
    """Fair share within its queue lane; null: 1."""
    requests_per_minute: PerMinute | None = None
    """Rate limit; null: none."""
    tokens_per_minute: PerMinute | None = None
    """Rate limit (prompt estimate + max_tokens); null: none."""
    budgets: tuple[BudgetSettings, ...] | None = None
    """Replaces every budget (as in the config file); null or []: none."""
    monthly_budget_usd: LimitUsd | None = None
    """The hard monthly budget named 'monthly'; null: none."""
    log_prompts: bool | None = None
    """Opt-in to prompts in access log lines; null: off."""

    def given(self) -> dict[str, Any]:
        """The fields the change names, JSON-ready (``None``: back to the default), as
        ``TenantProfile.merged`` and the store take them."""
        return self.model_dump(mode="json", include=self.model_fields_set)
