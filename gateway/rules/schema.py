"""SQL tables of the rules: one row per version of a tenant's rule file."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, String, Table, Text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.accounting.schema import SCHEMA_LOCK_KEY, UTCDateTime
from gateway.sqlschema import create_missing_tables

__all__ = ["create_rules_schema", "rule_versions"]

_RULES_LOCK_KEY = SCHEMA_LOCK_KEY + 2

metadata = MetaData()

rule_versions = Table(
    "rule_versions",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("author", String(256), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("action", String(16), nullable=False),  # put | delete | rollback
    Column("source", Text, nullable=True),  # the rule file as written; NULL: deleted
    Column("diff", Text, nullable=False),  # unified diff from the previous version
    Column("restored", Integer, nullable=True),  # a rollback: the version it restored
)


async def create_rules_schema(engine: AsyncEngine) -> None:
    """Create the rule tables if missing; safe from several processes at once."""
    async with engine.begin() as conn:
        await create_missing_tables(conn, metadata, _RULES_LOCK_KEY)
