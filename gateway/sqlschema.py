"""Creating the tables that are missing, safely from several processes at once.

The tenants, keys and rules tables are created at connect (the ledger's go through Alembic). Every
statement is ``CREATE ... IF NOT EXISTS``, so two processes that start together cannot both decide
a table is missing and collide; on PostgreSQL an advisory lock held for the transaction also
serialises them.
"""

from __future__ import annotations

from sqlalchemy import Index, MetaData, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.schema import CreateIndex, CreateTable

__all__ = ["create_missing_tables"]


async def create_missing_tables(conn: AsyncConnection, metadata: MetaData, lock_key: int) -> None:
    """Create ``metadata``'s missing tables and indexes inside ``conn``'s transaction."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock_key})
    for table in metadata.sorted_tables:
        await conn.execute(CreateTable(table, if_not_exists=True))
        for index in sorted(table.indexes, key=_index_name):
            await conn.execute(CreateIndex(index, if_not_exists=True))


def _index_name(index: Index) -> str:
    return str(index.name)
