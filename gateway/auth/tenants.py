"""Run-time tenants and keys as the store returns them.

A ``TenantProfile`` is what an operator sets for a tenant at run time (the same fields as a
config-file tenant, minus the key variable); ``KeyRecord`` is one API key's row, without its
secret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.auth.principals import Principal
from router.catalog import Tier

__all__ = ["KeyRecord", "TenantProfile", "TenantRecord", "check_roles", "valid_name"]

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def check_roles(roles: tuple[str, ...]) -> str | None:
    """``None`` if every role is well formed, else what is wrong."""
    if not roles:
        return "a key needs at least one role"
    for role in roles:
        kind, sep, tenant = role.partition(":")
        if role in ("admin", "finance"):
            continue
        if kind in ("tenant", "rules") and sep and valid_name(tenant):
            continue
        return f"unknown role {role!r}: use tenant:<name>, rules:<name>, finance or admin"
    return None


class TenantProfile(BaseModel):
    """A tenant's settings, as the admin API and CLI accept them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_tier: Tier = Tier.SMALL
    allowed_tiers: tuple[Tier, ...] = (Tier.SMALL, Tier.LARGE, Tier.EXTERNAL)
    allowed_models: tuple[str, ...] | None = None
    """Deployments this tenant may use; ``None``: every deployment of its allowed tiers."""
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    priority: Literal["interactive", "standard", "batch"] = "standard"
    monthly_budget_usd: Decimal | None = Field(default=None, ge=0)
    """Placeholder for budgets: stored and shown, not enforced yet."""
    log_prompts: bool = False
    """Opt-in to having prompts in access log lines (``logging.log_prompts`` must be on too)."""


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
