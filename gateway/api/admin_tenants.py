"""``/v1/admin/tenants``: run-time tenants, and the config-file ones shown beside them (admin
role, on the admin port).

Bodies are schemas (``TenantCreate``, ``TenantChanges``): an unknown field or a wrong type is a
400 ``invalid_request`` naming it (``gateway.api.errors``), and ``/openapi.json`` on the admin
port publishes them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import Field

from gateway.api.access import ADMIN, access
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.api.tenant_views import config_view, runtime_view
from gateway.auth.admin import AuthAdmin
from gateway.auth.tenant_changes import TenantChanges
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.parts import Services
from gateway.safe_text import SafeName

__all__ = ["admin_of", "router"]

router = APIRouter(
    prefix="/v1/admin/tenants",
    dependencies=[access(ADMIN)],
    tags=["admin"],
    responses=refusals(400, 404, 409),
)


TenantName = Annotated[SafeName, Path(min_length=1)]
"""A config-file tenant's name or a run-time one's (``gateway.auth.tenants.valid_name``)."""


class TenantCreate(TenantProfile):
    """A new run-time tenant: its name and any of its settings (the rest take their
    defaults)."""

    name: Annotated[SafeName, Field(min_length=1)]
    """1-63 of a-z, 0-9, '-', '_', starting alphanumeric; not a config-file tenant's."""


def admin_of(services: Services) -> AuthAdmin:
    return AuthAdmin(services.auth.store, services.auth.changes, services.auth)


def _view(services: Services, record: TenantRecord) -> dict[str, Any]:
    return runtime_view(services.settings, services.policies, record)


def _check_models(services: Services, profile: TenantProfile) -> None:
    wrong = profile.unknown_deployment(spec.model for spec in services.catalog.deployments)
    if wrong is not None:
        param, message = wrong
        raise InvalidRequest(message, param=param)


@router.get("")
async def list_tenants(services: ServicesDep) -> dict[str, Any]:
    records = await admin_of(services).store.list_tenants()
    configured = [
        config_view(services.settings, services.policies, name)
        for name in sorted(services.settings.tenants)
    ]
    return {"object": "list", "data": configured + [_view(services, r) for r in records]}


@router.post("", status_code=201)
async def create_tenant(services: ServicesDep, body: TenantCreate) -> dict[str, Any]:
    if body.name in services.settings.tenants:
        raise Conflict(f"tenant {body.name!r} is defined in the config file")
    profile = TenantProfile.model_validate(body.model_dump(exclude={"name"}))
    _check_models(services, profile)
    return _view(services, await admin_of(services).create_tenant(body.name, profile))


@router.get("/{name}")
async def get_tenant(services: ServicesDep, name: TenantName) -> dict[str, Any]:
    """A run-time tenant; else a config-file tenant (read-only: change it in the file)."""
    try:
        return _view(services, await admin_of(services).store.get_tenant(name))
    except NotFound:
        if name not in services.settings.tenants:
            raise
    return config_view(services.settings, services.policies, name)


@router.patch("/{name}")
async def update_tenant(
    services: ServicesDep, name: TenantName, changes: TenantChanges
) -> dict[str, Any]:
    admin = admin_of(services)
    given = changes.given()
    try:
        current = await admin.store.get_tenant(name)
    except NotFound:
        _refuse_config_tenant(services, name)
        raise
    _check_models(services, current.profile.merged(given))
    return _view(services, await admin.update_tenant(name, given))


@router.delete("/{name}", status_code=204)
async def delete_tenant(services: ServicesDep, name: TenantName) -> Response:
    try:
        await admin_of(services).delete_tenant(name)
    except NotFound:
        _refuse_config_tenant(services, name)
        raise
    return Response(status_code=204)


def _refuse_config_tenant(services: Services, name: str) -> None:
    """A config-file tenant (with no run-time row of its name) is changed in the file."""
    if name in services.settings.tenants:
        raise Conflict(f"tenant {name!r} is defined in the config file; change it there")
