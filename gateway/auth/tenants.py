"""Run-time tenants and keys as the store returns them.

A ``TenantProfile`` is what an operator sets for a tenant at run time (the same fields as a
config-file tenant, minus the key variable, plus ``monthly_budget_usd``); ``KeyRecord`` is one
API key's row, without its secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.auth import principals
from gateway.auth.principals import Principal
from gateway.errors import InvalidRequest
from gateway.settings import BudgetSettings
from router.catalog import Tier

__all__ = [
    "KeyRecord",
    "LimitUsd",
    "PerMinute",
    "Priority",
    "TenantProfile",
    "TenantRecord",
    "Threshold",
    "Weight",
    "check_roles",
    "valid_name",
]

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def check_roles(roles: tuple[str, ...]) -> str | None:
    """``None`` if every role is well formed and they name at most one tenant (a run-time
    tenant's name after ``tenant:`` / ``rules:``), else what is wrong."""
    return principals.check_roles(roles, tenant_name=valid_name)


MONTHLY = "monthly"
"""The name of the budget ``monthly_budget_usd`` stands for."""


Threshold = Annotated[float, Field(ge=0.0, le=1.0)]
Priority = Literal["interactive", "standard", "batch"]
Weight = Annotated[float, Field(gt=0)]
PerMinute = Annotated[int, Field(ge=1)]
LimitUsd = Annotated[Decimal, Field(gt=0)]
"""The constrained types of a tenant's settings, shared by ``TenantProfile`` and the partial
update ``gateway.auth.tenant_changes.TenantChanges``."""


class TenantProfile(BaseModel):
    """A tenant's settings, as the admin API and CLI accept them. Each field means what the
    config-file tenant's field of the same name means (``gateway.settings.TenantSettings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    default_tier: Tier = Tier.SMALL
    """Where a request goes when routing has no opinion."""
    allowed_tiers: tuple[Tier, ...] = (Tier.SMALL, Tier.LARGE, Tier.EXTERNAL)
    """Tiers the tenant may use."""
    allowed_models: tuple[str, ...] | None = None
    """Deployments this tenant may use; ``None``: every deployment of its allowed tiers."""
    threshold: Threshold | None = None
    """Classifier score at or above which ``auto`` goes large; ``None``: the model's
    calibrated default."""
    baseline_model: str | None = None
    """Deployment whose prices define the ledger's baseline cost; default: the first large
    deployment."""
    priority: Priority = "standard"
    """Default queue lane."""
    weight: Weight = 1.0
    """Fair share within a priority lane, relative to the other tenants there."""
    requests_per_minute: PerMinute | None = None
    """Rate limit shared by every gateway process; ``None``: none."""
    tokens_per_minute: PerMinute | None = None
    """Rate limit (prompt estimate + output budget); ``None``: none."""
    budgets: tuple[BudgetSettings, ...] = ()
    """Spending limits, written as in the config file; names unique."""
    monthly_budget_usd: LimitUsd | None = None
    """Shorthand for one more budget: hard, over the UTC month, named ``monthly``."""
    log_prompts: bool = False
    """Opt-in to having prompts in access log lines (``logging.log_prompts`` must be on too)."""

    @model_validator(mode="after")
    def _budget_names_unique(self) -> TenantProfile:
        names = [b.name for b in self.all_budgets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            hint = f" (monthly_budget_usd is the budget {MONTHLY!r})" if MONTHLY in twice else ""
            raise ValueError(f"budget names must be unique: {twice}{hint}")
        return self

    @property
    def all_budgets(self) -> tuple[BudgetSettings, ...]:
        """``budgets``, and the one ``monthly_budget_usd`` stands for when it is set."""
        if self.monthly_budget_usd is None:
            return self.budgets
        monthly = BudgetSettings(
            name=MONTHLY, limit_usd=self.monthly_budget_usd, window="month", mode="hard"
        )
        return (*self.budgets, monthly)

    def unknown_deployment(self, known: Iterable[str]) -> tuple[str, str] | None:
        """``None`` if every deployment it names is in ``known``, else the field and what is
        wrong."""
        models = set(known)
        unknown = sorted(set(self.allowed_models or ()) - models)
        if unknown:
            return "allowed_models", f"unknown deployments {unknown}"
        if self.baseline_model is not None and self.baseline_model not in models:
            return "baseline_model", f"unknown deployment {self.baseline_model!r}"
        return None

    def merged(self, changes: Mapping[str, Any]) -> TenantProfile:
        """This profile with ``changes`` (field → new value; a list replaces the whole list;
        ``None`` puts the field back to its default) or ``InvalidRequest`` naming the first
        problem."""
        merged = {**self.model_dump(mode="json"), **changes}
        try:
            return TenantProfile.model_validate(
                {k: v for k, v in merged.items() if v is not None or k not in _FIELDS}
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidRequest(
                f"invalid tenant settings: {where + ': ' if where else ''}{first['msg']}",
                param=str(first["loc"][0]) if first["loc"] else None,
            ) from None

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> TenantProfile:
        """A profile as SQL holds it. Profiles stored before budgets were enforced may carry
        ``monthly_budget_usd: 0``, which was accepted then and meant nothing; it loads as unset
        (new ones must be above zero, like every budget limit).

        Fields this version does not know (written by a newer one, before a rollback) are
        ignored, and ``ValidationError`` raised for what it knows but cannot accept."""
        stored = {k: v for k, v in data.items() if k in cls.model_fields}
        if _is_zero(stored.get("monthly_budget_usd")):
            stored["monthly_budget_usd"] = None
        return cls.model_validate(stored)


_FIELDS = frozenset(TenantProfile.model_fields)


def _is_zero(value: object) -> bool:
    if value is None or isinstance(value, bool):
        return False
    try:
        return Decimal(str(value)) == 0
    except InvalidOperation:
        return False


@dataclass(frozen=True, slots=True)
class TenantRecord:
    name: str
    profile: TenantProfile
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key_id: str
    salt: str
    digest: str
    principal: str
    roles: tuple[str, ...]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    replaced_by: str | None
    note: str | None

    def usable_at(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def to_principal(self) -> Principal:
        return Principal(self.principal, frozenset(self.roles))

    def public(self) -> dict[str, object]:
        """What listings show: everything but salt and digest."""
        return {
            "key_id": self.key_id,
            "principal": self.principal,
            "roles": list(self.roles),
            "created_at": _iso(self.created_at),
            "expires_at": _iso(self.expires_at),
            "revoked_at": _iso(self.revoked_at),
            "last_used_at": _iso(self.last_used_at),
            "replaced_by": self.replaced_by,
            "note": self.note,
        }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
