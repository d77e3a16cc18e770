"""Who is calling, and what they may do.

Roles, as DESIGN.md defines them: ``tenant:<name>`` (call the API, read its own reports and rules),
``rules:<tenant>`` (also write that tenant's rules), ``finance`` (read every tenant's reports),
``admin`` (everything).

A key acts for at most one tenant: its ``tenant:`` and ``rules:`` roles all name the same one
(``tenant:acme`` with ``rules:acme`` is fine; with ``rules:globex`` it is refused wherever a key
is made — admin API, CLI, config file — by ``check_roles``). Which tenant a key with two would
call models and read reports as cannot be told from the key, so such a key acts for none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Principal", "check_roles", "tenants_of"]

_TENANT_KINDS = ("tenant", "rules")
_PLAIN_ROLES = ("admin", "finance")


def tenants_of(roles: Iterable[str]) -> frozenset[str]:
    """The tenants named by ``tenant:<name>`` and ``rules:<name>`` roles."""
    found: set[str] = set()
    for role in roles:
        kind, sep, name = role.partition(":")
        if kind in _TENANT_KINDS and sep and name:
            found.add(name)
    return frozenset(found)


def check_roles(roles: Iterable[str], *, tenant_name: Callable[[str], bool]) -> str | None:
    """``None`` if every role is well formed (``tenant_name`` judges the name after
    ``tenant:`` / ``rules:``) and they name at most one tenant, else what is wrong."""
    roles = tuple(roles)
    if not roles:
        return "a key needs at least one role"
    for role in roles:
        if role in _PLAIN_ROLES:
            continue
        kind, sep, tenant = role.partition(":")
        if kind in _TENANT_KINDS and sep and tenant_name(tenant):
            continue
        shown = role if len(role) <= 80 and role.isprintable() else f"{role[:80]!r}…"
        return f"unknown role {shown!r}: use tenant:<name>, rules:<name>, finance or admin"
    tenants = tenants_of(roles)
    if len(tenants) > 1:
        return (
            f"a key acts for one tenant; these roles name {len(tenants)}: "
            f"{', '.join(sorted(tenants))} (issue one key per tenant)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    roles: frozenset[str]

    @property
    def tenant(self) -> str | None:
        """The tenant this principal acts for (``tenant:<name>`` or ``rules:<name>``), if any;
        ``None`` too for roles naming two tenants (refused when a key is made)."""
        tenants = tenants_of(self.roles)
        return next(iter(tenants)) if len(tenants) == 1 else None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    def can_call_models(self) -> bool:
        return self.tenant is not None

    def can_read_tenant(self, tenant: str) -> bool:
        return self.is_admin or "finance" in self.roles or self.tenant == tenant
