"""``/v1/admin/tenants``: run-time tenants (admin role, on the admin port).

Bodies are schemas (``TenantCreate``, ``TenantChanges``): an unknown field or a wrong type is a
400 ``invalid_request`` naming it (``gateway.api.errors``), and ``/openapi.json`` on the admin
port publishes them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from gateway.api.deps import ServicesDep
from gateway.auth.access import ADMIN, access
from gateway.auth.admin import AuthAdmin
from gateway.auth.tenant_changes import TenantChanges
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.errors import Conflict, InvalidRequest, ServiceUnavailable
from gateway.services import Services

__all__ = ["admin_of", "router"]

router = APIRouter(prefix="/v1/admin/tenants", dependencies=[access(ADMIN)], tags=["admin"])


class TenantCreate(TenantProfile):
    """A new run-time tenant: its name and any of its settings (the rest take their
    defaults)."""

    name: str
    """1-63 of a-z, 0-9, '-', '_', starting alphanumeric; not a config-file tenant's."""


def admin_of(services: Services) -> AuthAdmin:
    if services.auth is None:
        raise ServiceUnavailable("run-time tenants and keys are not enabled in this process")
    return AuthAdmin(services.auth.store, services.auth.changes, services.auth)


def _view(record: TenantRecord, *, source: str = "runtime") -> dict[str, Any]:
    return {
        "name": record.name,
        "source": source,
        **record.profile.model_dump(mode="json"),
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
    }


def _check_models(services: Services, profile: TenantProfile) -> None:
    wrong = profile.unknown_deployment(spec.model for spec in services.catalog.deployments)
    if wrong is not None:
        param, message = wrong
        raise InvalidRequest(message, param=param)


@router.get("")
async def list_tenants(services: ServicesDep) -> dict[str, Any]:
    records = await admin_of(services).store.list_tenants()
    configured = [
        {"name": name, "source": "config", "default_tier": t.default_tier.value}
        for name, t in sorted(services.settings.tenants.items())
    ]
    return {"object": "list", "data": configured + [_view(r) for r in records]}


@router.post("", status_code=201)
async def create_tenant(services: ServicesDep, body: TenantCreate) -> dict[str, Any]:
    if body.name in services.settings.tenants:
        raise Conflict(f"tenant {body.name!r} is defined in the config file")
    profile = TenantProfile.model_validate(body.model_dump(exclude={"name"}))
    _check_models(services, profile)
    return _view(await admin_of(services).create_tenant(body.name, profile))


@router.get("/{name}")
async def get_tenant(services: ServicesDep, name: str) -> dict[str, Any]:
    return _view(await admin_of(services).store.get_tenant(name))


@router.patch("/{name}")
async def update_tenant(services: ServicesDep, name: str, changes: TenantChanges) -> dict[str, Any]:
    admin = admin_of(services)
    given = changes.given()
    current = await admin.store.get_tenant(name)
    _check_models(services, current.profile.merged(given))
    return _view(await admin.update_tenant(name, given))


@router.delete("/{name}", status_code=204)
async def delete_tenant(services: ServicesDep, name: str) -> Response:
    await admin_of(services).delete_tenant(name)
    return Response(status_code=204)
