"""``/v1/admin/keys``: issue, list, rotate and revoke API keys (admin role, on the admin port).

The plain key is in the response to ``POST /v1/admin/keys`` and ``…/rotate`` only; listings show
the key id, never the key or its hash.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gateway.api.access import ADMIN, access
from gateway.api.admin_tenants import admin_of
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.auth.admin import MAX_KEY_LIFETIME_S
from gateway.auth.store import MAX_NOTE_CHARS, IssuedKey
from gateway.safe_text import SafeName, no_control

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/admin/keys",
    dependencies=[access(ADMIN)],
    tags=["admin"],
    responses=refusals(400, 404, 409),
)


Note = Annotated[str, Field(max_length=MAX_NOTE_CHARS), AfterValidator(no_control)]
KeyId = Annotated[SafeName, Path(min_length=1)]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    principal: Annotated[SafeName, Field(min_length=1)]
    roles: list[SafeName] = Field(min_length=1, max_length=16)
    """One tenant at most: ``tenant:<name>`` and ``rules:<name>`` name the same one."""
    expires_in_s: int | None = Field(default=None, ge=1, le=MAX_KEY_LIFETIME_S)
    note: Note | None = None


class KeyRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlap_s: int = Field(default=3600, ge=0, le=30 * 86400)
    """How long the old key keeps working after the new one is issued."""


def _issued(issued: IssuedKey) -> dict[str, Any]:
    return {**issued.record.public(), "key": issued.key}


@router.get("")
async def list_keys(
    services: ServicesDep, principal: Annotated[SafeName | None, Query()] = None
) -> dict[str, Any]:
    records = await admin_of(services).store.list_keys(principal=principal)
    return {"object": "list", "data": [r.public() for r in records]}


@router.post("", status_code=201)
async def create_key(services: ServicesDep, body: KeyCreate) -> dict[str, Any]:
    expires = None if body.expires_in_s is None else timedelta(seconds=body.expires_in_s)
    issued = await admin_of(services).create_key(
        body.principal, body.roles, expires_in=expires, note=body.note
    )
    return _issued(issued)


@router.get("/{key_id}")
async def get_key(services: ServicesDep, key_id: KeyId) -> dict[str, Any]:
    return (await admin_of(services).store.get_key(key_id)).public()


@router.post("/{key_id}/rotate", status_code=201)
async def rotate_key(services: ServicesDep, key_id: KeyId, body: KeyRotate) -> dict[str, Any]:
    issued = await admin_of(services).rotate_key(key_id, overlap=timedelta(seconds=body.overlap_s))
    return _issued(issued)


@router.post("/{key_id}/revoke")
async def revoke_key(services: ServicesDep, key_id: KeyId) -> dict[str, Any]:
    return (await admin_of(services).revoke_key(key_id)).public()
