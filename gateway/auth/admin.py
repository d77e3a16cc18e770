"""``AuthAdmin``: changes to tenants and keys, the same for the admin API and the CLI.

Every change commits to SQL first, then bumps the Redis version and publishes (so every gateway
process reloads its copy), then reloads this process's copy when it has one. If Redis cannot be
told, the change stands in SQL and the caller gets ``ServiceUnavailable`` saying so: other
processes then see it only at their periodic full reload.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.exceptions import RedisError

from gateway.auth.changes import AuthChanges
from gateway.auth.runtime import RuntimeAuth
from gateway.auth.store import IssuedKey, SqlAuthStore
from gateway.auth.tenants import KeyRecord, TenantProfile, TenantRecord
from gateway.errors import InvalidRequest, ServiceUnavailable
from gateway.queue.client.connection import configured_client
from gateway.settings import Settings

__all__ = ["MAX_KEY_LIFETIME_S", "AuthAdmin", "open_auth_admin"]

MAX_KEY_LIFETIME_S = 3650 * 86400
"""The longest expiry a key can be given (ten years); a key without one never expires."""


_MAX_LIFETIME = timedelta(seconds=MAX_KEY_LIFETIME_S)


class AuthAdmin:
    def __init__(
        self, store: SqlAuthStore, changes: AuthChanges | None, local: RuntimeAuth | None = None
    ) -> None:
        """``changes`` ``None``: no shared Redis to tell (processes see changes at their next
        full reload)."""
        self.store = store
        self.changes = changes
        self.local = local

    async def _announce(self, what: str) -> None:
        if self.changes is None:
            return
        try:
            version = await self.changes.announce()
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(
                f"{what} is saved, but Redis could not be told ({type(exc).__name__}): other "
                "gateway processes apply it at their next full reload"
            ) from None
        if self.local is not None:
            await self.local.reload(version)

    async def create_tenant(self, name: str, profile: TenantProfile) -> TenantRecord:
        record = await self.store.create_tenant(name, profile)
        await self._announce(f"tenant {name!r}")
        return record

    async def update_tenant(self, name: str, changes: Mapping[str, Any]) -> TenantRecord:
        record = await self.store.update_tenant(name, changes)
        await self._announce(f"tenant {name!r}")
        return record

    async def delete_tenant(self, name: str) -> None:
        await self.store.delete_tenant(name)
        await self._announce(f"deleting tenant {name!r}")

    async def create_key(
        self,
        principal: str,
        roles: Sequence[str],
        *,
        expires_in: timedelta | None = None,
        note: str | None = None,
    ) -> IssuedKey:
        if expires_in is not None and not timedelta(0) < expires_in <= _MAX_LIFETIME:
            raise InvalidRequest(
                f"a key's expiry is 1 s to {MAX_KEY_LIFETIME_S} s (ten years) away, or none",
                param="expires_in_s",
            )
        expires_at = None if expires_in is None else datetime.now(UTC) + expires_in
        issued = await self.store.create_key(principal, roles, expires_at=expires_at, note=note)
        await self._announce(f"key {issued.record.key_id}")
        return issued

    async def rotate_key(self, key_id: str, *, overlap: timedelta) -> IssuedKey:
        issued = await self.store.rotate_key(key_id, overlap=overlap)
        await self._announce(f"rotation of key {key_id}")
        return issued

    async def revoke_key(self, key_id: str) -> KeyRecord:
        record = await self.store.revoke_key(key_id)
        await self._announce(f"revocation of key {key_id}")
        return record


@contextlib.asynccontextmanager
async def open_auth_admin(settings: Settings) -> AsyncIterator[AuthAdmin]:
    """For the CLI: the configured database, and the configured Redis when there is one."""
    store = await SqlAuthStore.connect(settings.database.url)
    redis = configured_client(settings.redis, socket_timeout=2.0) if settings.redis.url else None
    try:
        changes = AuthChanges(redis, settings.redis.key_prefix) if redis is not None else None
        yield AuthAdmin(store, changes)
    finally:
        if redis is not None:
            await redis.aclose()
        await store.aclose()
