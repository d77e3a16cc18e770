"""Authorization in one place: every route declares who may call it.

    @router.get("/v1/reports/costs")
    async def costs(principal: Annotated[Principal, access(FINANCE, TENANT)]) -> ...

``access(...)`` authenticates the caller and checks its roles before the handler runs; handlers
then only scope data (a tenant sees its own). A test walks every route of the app and fails on
one that declares nothing.

Role names: ``PUBLIC`` (no key), ``AUTHENTICATED`` (any valid key; the handler narrows),
``TENANT`` (``tenant:<name>`` or ``rules:<name>``), ``RULES`` (``rules:<name>``), ``FINANCE``,
``ADMIN`` (always allowed where any role is).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Depends, Request

from gateway.api.deps import authenticate
from gateway.auth.principals import Principal
from gateway.errors import PermissionDenied

__all__ = [
    "ADMIN",
    "AUTHENTICATED",
    "FINANCE",
    "PUBLIC",
    "RULES",
    "TENANT",
    "AccessGuard",
    "access",
]

PUBLIC = "public"
AUTHENTICATED = "authenticated"
TENANT = "tenant"
RULES = "rules"
FINANCE = "finance"
ADMIN = "admin"
_KNOWN = frozenset({PUBLIC, AUTHENTICATED, TENANT, RULES, FINANCE, ADMIN})


def _has(principal: Principal, role: str) -> bool:
    if role == AUTHENTICATED or "admin" in principal.roles:
        return True
    if role in (TENANT, RULES):
        prefixes = ("tenant:", "rules:") if role == TENANT else ("rules:",)
        return any(r.startswith(prefixes) for r in principal.roles)
    return role in principal.roles


class AccessGuard:
    """The dependency behind ``access``; its ``roles`` are what the route declared."""

    def __init__(self, roles: tuple[str, ...]) -> None:
        unknown = set(roles) - _KNOWN
        if not roles or unknown:
            raise ValueError(f"access() needs known roles, got {roles!r}")
        self.roles = roles

    async def __call__(self, request: Request) -> Principal | None:
        if PUBLIC in self.roles:
            return None
        started = time.perf_counter()
        principal = authenticate(request)
        request.state.auth_s = time.perf_counter() - started
        if not any(_has(principal, role) for role in self.roles):
            raise PermissionDenied(f"principal {principal.name!r} may not call {request.url.path}")
        return principal


def access(*roles: str) -> Any:
    """Declare who may call a route (use as a parameter default or in ``dependencies``)."""
    return Depends(AccessGuard(tuple(roles)))
