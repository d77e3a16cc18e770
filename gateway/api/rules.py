"""``/v1/rules``: each tenant's routing rules — list, get, put, validate, delete, history,
rollback. ``rules:<tenant>`` and ``admin`` keys write a tenant's rules; a ``tenant:<name>`` key
reads its own only; ``finance`` reads every tenant's; the global rules (``_global``) are written
by ``admin`` and read by all. A change's author is the principal's name, with the person's name
after it when ``?author=`` gives one (``rules-acme (alice)``).

The body of ``PUT`` and ``validate`` is the rule file itself (YAML or JSON). A rejected file
answers 400 ``invalid_rules`` naming the line, and the running rules stay in force.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import AfterValidator

from gateway.api.access import ADMIN, FINANCE, RULES, TENANT, access
from gateway.api.admission import read_body
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.auth.principals import Principal
from gateway.errors import InvalidRequest, ModelNotFound, PermissionDenied
from gateway.parts import Services
from gateway.rules.edge import RulesRuntime
from gateway.rules.store import GLOBAL, RuleVersion, unified_diff
from gateway.safe_text import no_control
from router.rules import MAX_RULE_BYTES, RulesInvalid

__all__ = [
    "Reader",
    "TenantName",
    "can_write",
    "invalid_rules",
    "readable_tenant",
    "router",
    "runtime",
]

router = APIRouter(prefix="/v1/rules", tags=["rules"], responses=refusals(400, 404))

Reader = Annotated[Principal, access(TENANT, RULES, FINANCE, ADMIN)]
Writer = Annotated[Principal, access(RULES, ADMIN)]
TenantName = Annotated[str, Path(min_length=1, max_length=128), AfterValidator(no_control)]
MAX_VERSION = 2**31 - 1
"""Versions are SQL ``INTEGER``s: a larger number is refused (400), never sent to SQL."""
Version = Annotated[int, Path(ge=1, le=MAX_VERSION)]
AuthorNote = Annotated[
    str | None,
    Query(
        alias="author",
        max_length=64,
        pattern=r"^[\w .@'-]+$",
        description="the person making the change, recorded after the principal's name",
    ),
]


def runtime(services: Services) -> RulesRuntime:
    return services.rules


def known_tenant(services: Services, tenant: str) -> None:
    if tenant != GLOBAL and tenant not in services.policies:
        raise ModelNotFound(f"unknown tenant {tenant!r}", code="not_found", param="tenant")


def may_read(principal: Principal, tenant: str) -> None:
    if principal.is_admin or tenant == GLOBAL or principal.can_read_tenant(tenant):
        return
    raise PermissionDenied(f"principal {principal.name!r} may not read the rules of {tenant!r}")


def can_write(principal: Principal, tenant: str) -> bool:
    return principal.is_admin or (
        tenant != GLOBAL and principal.tenant == tenant and f"rules:{tenant}" in principal.roles
    )


def _may_write(principal: Principal, tenant: str) -> None:
    if can_write(principal, tenant):
        return
    raise PermissionDenied(f"principal {principal.name!r} may not change the rules of {tenant!r}")


def readable_tenant(services: Services, principal: Principal, tenant: str) -> None:
    """Refuse unless ``principal`` may read ``tenant``'s rules (403) and the tenant exists
    (404): permission first, so a caller learns nothing of tenants it may not read."""
    may_read(principal, tenant)
    known_tenant(services, tenant)


def _writable_tenant(services: Services, principal: Principal, tenant: str) -> None:
    """As ``readable_tenant``, for changing the tenant's rules."""
    _may_write(principal, tenant)
    known_tenant(services, tenant)


def _author(principal: Principal, person: str | None) -> str:
    """Who made a change: always the principal (keys are shared by a team), and the person."""
    person = (person or "").strip()
    return f"{principal.name} ({person})" if person else principal.name


def invalid_rules(exc: RulesInvalid) -> InvalidRequest:
    return InvalidRequest(str(exc), code="invalid_rules", param=exc.path or None)


async def _source(request: Request) -> str:
    raw = await read_body(request, MAX_RULE_BYTES)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("the rule file must be UTF-8 text", code="invalid_rules") from None


def _view(version: RuleVersion | None, tenant: str, *, with_source: bool = True) -> dict[str, Any]:
    if version is None:
        return {"object": "rules", "tenant": tenant, "version": 0, "source": None}
    body: dict[str, Any] = {"object": "rules", **version.summary()}
    if with_source:
        body["source"] = version.source
    return body


@router.get("")
async def list_rules(services: ServicesDep, principal: Reader) -> dict[str, Any]:
    versions = runtime(services).registry.versions
    visible = sorted(t for t in versions if t == GLOBAL or principal.can_read_tenant(t))
    return {
        "object": "list",
        "data": [{"tenant": t, "version": versions[t]} for t in visible],
        "principal": principal.name,
        "tenant": principal.tenant,  # the caller's own tenant; None: finance or admin
    }


@router.get("/{tenant}")
async def get_rules(services: ServicesDep, principal: Reader, tenant: TenantName) -> dict[str, Any]:
    readable_tenant(services, principal, tenant)
    return _view(await runtime(services).registry.store.current(tenant), tenant)


@router.put("/{tenant}")
async def put_rules(
    request: Request,
    services: ServicesDep,
    principal: Writer,
    tenant: TenantName,
    author: AuthorNote = None,
) -> dict[str, Any]:
    _writable_tenant(services, principal, tenant)
    source = await _source(request)
    try:
        registry = runtime(services).registry
        version = await registry.apply(tenant, source, author=_author(principal, author))
    except RulesInvalid as exc:
        raise invalid_rules(exc) from None
    return _view(version, tenant)


@router.post("/{tenant}/validate")
async def validate_rules(
    request: Request, services: ServicesDep, principal: Writer, tenant: TenantName
) -> dict[str, Any]:
    _writable_tenant(services, principal, tenant)
    source = await _source(request)
    registry = runtime(services).registry
    try:
        compiled = await registry.validate(source)
    except RulesInvalid as exc:
        raise invalid_rules(exc) from None
    current = await registry.store.current(tenant)
    number = 0 if current is None else current.version
    return {
        "object": "rules.validation",
        "valid": True,
        "rules": [r.id for r in compiled.rules],
        "active_version": number,
        "diff": unified_diff(None if current is None else current.source, source, number + 1),
    }


@router.delete("/{tenant}")
async def delete_rules(
    services: ServicesDep, principal: Writer, tenant: TenantName
) -> dict[str, Any]:
    _writable_tenant(services, principal, tenant)
    registry = runtime(services).registry
    version = await registry.apply(tenant, None, author=principal.name, action="delete")
    return _view(version, tenant)


@router.get("/{tenant}/versions")
async def rule_history(
    services: ServicesDep, principal: Reader, tenant: TenantName
) -> dict[str, Any]:
    readable_tenant(services, principal, tenant)
    history = await runtime(services).registry.store.history(tenant)
    return {"object": "list", "data": [v.summary() for v in history]}


@router.get("/{tenant}/versions/{version}")
async def rule_version(
    services: ServicesDep, principal: Reader, tenant: TenantName, version: Version
) -> dict[str, Any]:
    readable_tenant(services, principal, tenant)
    found = await runtime(services).registry.store.get(tenant, version)
    if found is None:
        raise ModelNotFound(
            f"tenant {tenant!r} has no rules version {version}", code="not_found", param="version"
        )
    return _view(found, tenant)


@router.post("/{tenant}/rollback")
async def rollback_rules(
    services: ServicesDep,
    principal: Writer,
    tenant: TenantName,
    to: Annotated[int, Query(ge=1, le=MAX_VERSION)],
    author: AuthorNote = None,
) -> dict[str, Any]:
    """``?to=N``: a new version whose source is exactly version N's."""
    _writable_tenant(services, principal, tenant)
    registry = runtime(services).registry
    version = await registry.rollback(tenant, to, author=_author(principal, author))
    if version is None:
        raise ModelNotFound(
            f"tenant {tenant!r} has no rules version {to}", code="not_found", param="to"
        )
    return _view(version, tenant)
