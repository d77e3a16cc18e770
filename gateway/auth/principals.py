"""Who is calling, and what they may do.

Roles, as DESIGN.md defines them: ``tenant:<name>`` (call the API, read its own reports and rules),
``rules:<tenant>`` (also write that tenant's rules), ``finance`` (read every tenant's reports),
``admin`` (everything).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Principal"]


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    roles: frozenset[str]

    @property
    def tenant(self) -> str | None:
        """The tenant this principal acts for (``tenant:<name>`` or ``rules:<name>``), if any."""
        for role in sorted(self.roles):
            kind, _, name = role.partition(":")
            if kind in {"tenant", "rules"} and name:
                return name
        return None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    def can_call_models(self) -> bool:
        return self.tenant is not None

    def can_read_tenant(self, tenant: str) -> bool:
        return self.is_admin or "finance" in self.roles or self.tenant == tenant
