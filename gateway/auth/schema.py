"""The tenants and API keys tables, created at connect like the ledger's (same database URL).

``api_keys`` holds no key material beyond a salted SHA-256 (see ``gateway.auth.tokens``).
"""

from __future__ import annotations

from sqlalchemy import JSON, Column, Index, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.accounting.schema import SCHEMA_LOCK_KEY, UTCDateTime
from gateway.sqlschema import create_missing_tables

__all__ = ["api_keys", "create_auth_schema", "tenants"]

_AUTH_LOCK_KEY = SCHEMA_LOCK_KEY + 1

metadata = MetaData(
    naming_convention={"ix": "ix_%(table_name)s_%(column_0_N_name)s", "pk": "pk_%(table_name)s"}
)

tenants = Table(
    "tenants",
    metadata,
    Column("name", String, primary_key=True),
    Column("profile", JSON, nullable=False, comment="TenantProfile as JSON"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String, primary_key=True),
    Column("salt", String, nullable=False),
    Column("digest", String, nullable=False),
    Column("principal", String, nullable=False),
    Column("roles", JSON, nullable=False, comment="JSON array of role strings"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime()),
    Column("revoked_at", UTCDateTime()),
    Column("last_used_at", UTCDateTime()),
    Column("replaced_by", String, comment="key id of the key that rotated this one"),
    Column("note", String),
    Index(None, "principal"),
)


async def create_auth_schema(conn: AsyncConnection) -> None:
    """Create the missing tables and indexes; safe from several processes at once."""
    await create_missing_tables(conn, metadata, _AUTH_LOCK_KEY)
