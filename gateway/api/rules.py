"""``/v1/rules``: each tenant's routing rules — list, get, put, validate, delete, history,
rollback. ``rules:<tenant>`` and ``admin`` keys write a tenant's rules; a ``tenant:<name>`` key
reads its own only; the global rules (``_global``) are written by ``admin`` and read by all.

The body of ``PUT`` and ``validate`` is the rule file itself (YAML or JSON). A rejected file
answers 400 ``invalid_rules`` naming the line, and the running rules stay in force.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from gateway.api.admission import read_body
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.auth.access import ADMIN, RULES, TENANT, access
from gateway.auth.principals import Principal
from gateway.errors import InvalidRequest, ModelNotFound, PermissionDenied, ServiceUnavailable
from gateway.rules.edge import RulesRuntime
from gateway.rules.store import GLOBAL, RuleVersion
from gateway.services import Services
from router.rules import MAX_RULE_BYTES, RulesInvalid

__all__ = ["router"]

router = APIRouter(prefix="/v1/rules", tags=["rules"], responses=refusals(400, 404))

Reader = Annotated[Principal, access(TENANT, RULES, ADMIN)]
Writer = Annotated[Principal, access(RULES, ADMIN)]
TenantName = Annotated[str, Path(min_length=1, max_length=128)]


def _runtime(services: Services) -> RulesRuntime:
    if services.rules is None:
        raise ServiceUnavailable("routing rules are not enabled in this process")
    return services.rules


def _known(services: Services, tenant: str) -> None:
    if tenant != GLOBAL and tenant not in services.policies:
        raise ModelNotFound(f"unknown tenant {tenant!r}", code="not_found", param="tenant")


def _may_read(principal: Principal, tenant: str) -> None:
    if principal.is_admin or tenant == GLOBAL or principal.tenant == tenant:
        return
    raise PermissionDenied(f"principal {principal.name!r} may not read the rules of {tenant!r}")


def _may_write(principal: Principal, tenant: str) -> None:
    if principal.is_admin or (tenant != GLOBAL and f"rules:{tenant}" in principal.roles):
        return
    raise PermissionDenied(f"principal {principal.name!r} may not change the rules of {tenant!r}")


def _invalid(exc: RulesInvalid) -> InvalidRequest:
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
    versions = _runtime(services).registry.versions
    visible = sorted(t for t in versions if principal.is_admin or t in (GLOBAL, principal.tenant))
    return {
        "object": "list",
        "data": [{"tenant": t, "version": versions[t]} for t in visible],
    }


@router.get("/{tenant}")
async def get_rules(services: ServicesDep, principal: Reader, tenant: TenantName) -> dict[str, Any]:
    _may_read(principal, tenant)
    _known(services, tenant)
    return _view(await _runtime(services).registry.store.current(tenant), tenant)


@router.put("/{tenant}")
async def put_rules(
    request: Request, services: ServicesDep, principal: Writer, tenant: TenantName
) -> dict[str, Any]:
    _may_write(principal, tenant)
    _known(services, tenant)
    source = await _source(request)
    try:
        version = await _runtime(services).registry.apply(tenant, source, author=principal.name)
    except RulesInvalid as exc:
        raise _invalid(exc) from None
    return _view(version, tenant)


@router.post("/{tenant}/validate")
async def validate_rules(
    request: Request, services: ServicesDep, principal: Writer, tenant: TenantName
) -> dict[str, Any]:
    _may_write(principal, tenant)
    _known(services, tenant)
    source = await _source(request)
    try:
        compiled = _runtime(services).registry.validate(source)
    except RulesInvalid as exc:
        raise _invalid(exc) from None
    return {"object": "rules.validation", "valid": True, "rules": [r.id for r in compiled.rules]}


@router.delete("/{tenant}")
async def delete_rules(
    services: ServicesDep, principal: Writer, tenant: TenantName
) -> dict[str, Any]:
    _may_write(principal, tenant)
    _known(services, tenant)
    registry = _runtime(services).registry
    version = await registry.apply(tenant, None, author=principal.name, action="delete")
    return _view(version, tenant)


@router.get("/{tenant}/versions")
async def rule_history(
    services: ServicesDep, principal: Reader, tenant: TenantName
) -> dict[str, Any]:
    _may_read(principal, tenant)
    _known(services, tenant)
    history = await _runtime(services).registry.store.history(tenant)
    return {"object": "list", "data": [v.summary() for v in history]}


@router.get("/{tenant}/versions/{version}")
async def rule_version(
    services: ServicesDep, principal: Reader, tenant: TenantName, version: int
) -> dict[str, Any]:
    _may_read(principal, tenant)
    _known(services, tenant)
    found = await _runtime(services).registry.store.get(tenant, version)
    if found is None:
        raise ModelNotFound(
            f"tenant {tenant!r} has no rules version {version}", code="not_found", param="version"
        )
    return _view(found, tenant)


@router.post("/{tenant}/rollback")
async def rollback_rules(
    services: ServicesDep, principal: Writer, tenant: TenantName, to: int
) -> dict[str, Any]:
    """``?to=N``: a new version whose source is exactly version N's."""
    _may_write(principal, tenant)
    _known(services, tenant)
    version = await _runtime(services).registry.rollback(tenant, to, author=principal.name)
    if version is None:
        raise ModelNotFound(
            f"tenant {tenant!r} has no rules version {to}", code="not_found", param="to"
        )
    return _view(version, tenant)
