"""``SqlAuthStore``: tenants and API keys in SQL (the ledger's database), SQL being the source
of truth; every gateway process keeps a copy in memory (``gateway.auth.runtime``).

Keys are created, rotated (the old key keeps working until its overlap window closes) and
revoked here; the plain key is returned once by ``create_key`` / ``rotate_key`` and never
stored.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.auth.schema import api_keys, create_auth_schema, tenants
from gateway.auth.tenants import (
    KeyRecord,
    TenantProfile,
    TenantRecord,
    check_roles,
    valid_name,
)
from gateway.auth.tokens import NewKey, new_key
from gateway.codec import NATIVE, RecordCodec
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.safe_text import MAX_NAME_CHARS, check_name
from gateway.sqlengine import create_sql_engine

__all__ = ["MAX_NOTE_CHARS", "IssuedKey", "SqlAuthStore"]

MAX_NOTE_CHARS = 256

log = logging.getLogger(__name__)

_KEY_ROW = RecordCodec(KeyRecord, {datetime: NATIVE})
"""A key's record to and from its ``api_keys`` row (the column names are the field names)."""


def _now() -> datetime:
    return datetime.now(UTC)


class IssuedKey:
    """A key just created: its record and, once, its plain value."""

    __slots__ = ("key", "record")

    def __init__(self, record: KeyRecord, key: str) -> None:
        self.record = record
        self.key = key

    def __repr__(self) -> str:
        return f"IssuedKey(key_id={self.record.key_id!r})"


def _tenant_record(row: RowMapping) -> TenantRecord:
    return TenantRecord(
        name=row["name"],
        profile=TenantProfile.from_stored(row["profile"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class SqlAuthStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @classmethod
    async def connect(cls, url: str, **engine_kwargs: Any) -> SqlAuthStore:
        store = cls(create_sql_engine(url, **engine_kwargs))
        try:
            async with store._engine.begin() as conn:
                await create_auth_schema(conn)
        except BaseException:
            await store.aclose()
            raise
        return store

    async def aclose(self) -> None:
        await self._engine.dispose()

    # tenants

    async def create_tenant(self, name: str, profile: TenantProfile) -> TenantRecord:
        if not valid_name(name):
            raise InvalidRequest(
                "tenant names are 1-63 of a-z, 0-9, '-', '_', starting alphanumeric",
                param="name",
            )
        now = _now()
        row = {"name": name, "profile": profile.model_dump(mode="json"), "created_at": now}
        try:
            async with self._engine.begin() as conn:
                await conn.execute(insert(tenants).values(**row, updated_at=now))
        except IntegrityError:
            raise Conflict(f"tenant {name!r} exists") from None
        return TenantRecord(name, profile, now, now)

    async def update_tenant(self, name: str, changes: Mapping[str, Any]) -> TenantRecord:
        current = await self.get_tenant(name)
        profile = current.profile.merged(changes)
        now = _now()
        async with self._engine.begin() as conn:
            await conn.execute(
                update(tenants)
                .where(tenants.c.name == name)
                .values(profile=profile.model_dump(mode="json"), updated_at=now)
            )
        return TenantRecord(name, profile, current.created_at, now)

    async def get_tenant(self, name: str) -> TenantRecord:
        async with self._engine.connect() as conn:
            row = (
                (await conn.execute(select(tenants).where(tenants.c.name == name)))
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"no tenant {name!r}")
        return _tenant_record(row)

    async def list_tenants(self) -> list[TenantRecord]:
        """Every tenant whose stored profile loads (see ``load_tenants``)."""
        records, _invalid = await self.load_tenants()
        return records

    async def load_tenants(self) -> tuple[list[TenantRecord], list[str]]:
        """The tenants whose stored profile loads, and the names of those whose profile does
        not (edited by hand in SQL, say): one bad row must not hide every other tenant."""
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tenants).order_by(tenants.c.name))).mappings()
            records: list[TenantRecord] = []
            invalid: list[str] = []
            for row in rows:
                try:
                    records.append(_tenant_record(row))
                except ValidationError as exc:
                    log.error(
                        "auth: stored settings of tenant %r are invalid (%d errors, first at %s)",
                        row["name"],
                        exc.error_count(),
                        ".".join(str(p) for p in exc.errors()[0]["loc"]) or "the top level",
                    )
                    invalid.append(row["name"])
            return records, invalid

    async def delete_tenant(self, name: str) -> None:
        """Remove a tenant and revoke every key acting for it."""
        now = _now()
        async with self._engine.begin() as conn:
            deleted = await conn.execute(delete(tenants).where(tenants.c.name == name))
            if deleted.rowcount == 0:
                raise NotFound(f"no tenant {name!r}")
            for record in await self._keys(conn):
                if record.revoked_at is None and any(
                    r in (f"tenant:{name}", f"rules:{name}") for r in record.roles
                ):
                    await conn.execute(
                        update(api_keys)
                        .where(api_keys.c.key_id == record.key_id)
                        .values(revoked_at=now)
                    )

    # keys

    async def create_key(
        self,
        principal: str,
        roles: Sequence[str],
        *,
        expires_at: datetime | None = None,
        note: str | None = None,
    ) -> IssuedKey:
        roles = tuple(dict.fromkeys(roles))
        problem = check_roles(roles)
        if problem is not None:
            raise InvalidRequest(problem, param="roles")
        if not principal:
            raise InvalidRequest("a principal name is 1-128 characters", param="principal")
        check_name(principal, param="principal", max_chars=MAX_NAME_CHARS)
        if note is not None:
            check_name(note, param="note", max_chars=MAX_NOTE_CHARS)
        made = new_key()
        record = self._new_record(made, principal, roles, expires_at, note)
        async with self._engine.begin() as conn:
            await conn.execute(insert(api_keys).values(**_KEY_ROW.to_values(record)))
        return IssuedKey(record, made.key)

    async def rotate_key(self, key_id: str, *, overlap: timedelta) -> IssuedKey:
        """A new key for the same principal and roles; the old one expires after ``overlap``."""
        if overlap < timedelta(0):
            raise InvalidRequest("the overlap window cannot be negative", param="overlap_s")
        old = await self.get_key(key_id)
        if not old.usable_at(_now()):
            raise Conflict(f"key {key_id} is revoked or expired; create a new one")
        if (problem := check_roles(old.roles)) is not None:  # made before the rule; not copied
            raise Conflict(f"key {key_id} cannot be rotated: {problem}")
        made = new_key()
        record = self._new_record(made, old.principal, old.roles, None, old.note)
        closes = _now() + overlap
        if old.expires_at is not None:
            closes = min(closes, old.expires_at)
        async with self._engine.begin() as conn:
            await conn.execute(insert(api_keys).values(**_KEY_ROW.to_values(record)))
            await conn.execute(
                update(api_keys)
                .where(api_keys.c.key_id == key_id)
                .values(expires_at=closes, replaced_by=record.key_id)
            )
        return IssuedKey(record, made.key)

    async def revoke_key(self, key_id: str) -> KeyRecord:
        async with self._engine.begin() as conn:
            await conn.execute(
                update(api_keys)
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=_now())
            )
        return await self.get_key(key_id)

    async def get_key(self, key_id: str) -> KeyRecord:
        async with self._engine.connect() as conn:
            found = await self._keys(conn, key_id=key_id)
        if not found:
            raise NotFound(f"no key {key_id!r}")
        return found[0]

    async def list_keys(self, *, principal: str | None = None) -> list[KeyRecord]:
        async with self._engine.connect() as conn:
            records = await self._keys(conn)
        return [r for r in records if principal is None or r.principal == principal]

    async def touch(self, last_used: Mapping[str, datetime]) -> None:
        """Record last-used times for many keys in one statement (batched by the caller)."""
        if not last_used:
            return
        stmt = (
            update(api_keys)
            .where(api_keys.c.key_id == bindparam("k"))
            .values(last_used_at=bindparam("t"))
        )
        async with self._engine.begin() as conn:
            await conn.execute(stmt, [{"k": k, "t": t} for k, t in last_used.items()])

    @staticmethod
    async def _keys(conn: Any, *, key_id: str | None = None) -> list[KeyRecord]:
        stmt = select(api_keys).order_by(api_keys.c.created_at, api_keys.c.key_id)
        if key_id is not None:
            stmt = stmt.where(api_keys.c.key_id == key_id)
        return [_KEY_ROW.from_values(r) for r in (await conn.execute(stmt)).mappings()]

    @staticmethod
    def _new_record(
        made: NewKey,
        principal: str,
        roles: tuple[str, ...],
        expires_at: datetime | None,
        note: str | None,
    ) -> KeyRecord:
        return KeyRecord(
            key_id=made.key_id,
            salt=made.salt,
            digest=made.digest,
            principal=principal,
            roles=roles,
            created_at=_now(),
            expires_at=expires_at,
            revoked_at=None,
            last_used_at=None,
            replaced_by=None,
            note=note,
        )
