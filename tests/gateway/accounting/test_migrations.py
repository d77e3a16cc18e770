"""Alembic migrations on real SQLite and PostgreSQL: fresh databases, pre-Alembic databases."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.schema import CreateIndex, CreateTable

from gateway.accounting import SqlLedger
from gateway.accounting.migrate import (
    HEAD_REVISION,
    VERSION_TABLE,
    current_revision,
    head_revision,
)
from gateway.accounting.schema import ledger_entries, metadata
from tests.gateway.accounting.factories import make_entry


def _diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return list(compare_metadata(context, metadata))


def _only_comment(item: Any) -> bool:
    return isinstance(item, list) and all(change[0] == "modify_comment" for change in item)


def test_head_revision_constant_is_alembics_head() -> None:
    # Bump HEAD_REVISION with every new migration: the connect-time check reads it.
    assert head_revision() == HEAD_REVISION


async def test_a_database_behind_head_is_upgraded(db_url: str) -> None:
    ledger = await SqlLedger.connect(db_url)
    try:
        async with ledger.engine.begin() as conn:
            await conn.execute(text("DROP TABLE IF EXISTS gpu_trueup"))
            await conn.execute(text("DROP TABLE IF EXISTS ledger_daily"))
            await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0001'"))
        await ledger.migrate()
        async with ledger.engine.connect() as conn:
            assert await current_revision(conn) == HEAD_REVISION
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            assert {"ledger_daily", "gpu_trueup"} <= tables
    finally:
        await ledger.aclose()


async def test_fresh_database_is_at_head_and_matches_the_metadata(ledger: SqlLedger) -> None:
    async with ledger.engine.connect() as conn:
        assert await current_revision(conn) == head_revision()
        assert await conn.run_sync(_diff) == []


async def test_migrate_twice_changes_nothing(ledger: SqlLedger) -> None:
    await ledger.record(make_entry("m1"))
    await ledger.migrate()
    assert await ledger.get("m1") is not None


async def _drop_everything(ledger: SqlLedger) -> None:
    async with ledger.engine.begin() as conn:
        for name in ("gpu_trueup", "ledger_daily", "ledger_entries", VERSION_TABLE):
            await conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


async def test_pre_alembic_database_is_stamped_and_upgraded(db_url: str) -> None:
    old = await SqlLedger.connect(db_url, migrate=False)
    try:
        await _drop_everything(old)
        # The skeleton's DDL, as it created databases before Alembic.
        async with old.engine.begin() as conn:
            await conn.execute(CreateTable(ledger_entries))
            for index in ledger_entries.indexes:
                await conn.execute(CreateIndex(index))
        assert await old.record(make_entry("before-alembic"))
    finally:
        await old.aclose()
    upgraded = await SqlLedger.connect(db_url)
    try:
        assert await upgraded.get("before-alembic") is not None
        async with upgraded.engine.connect() as conn:
            assert await current_revision(conn) == head_revision()
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            assert {"ledger_daily", "gpu_trueup", VERSION_TABLE} <= tables
            # The old DDL set no column comments on PostgreSQL; nothing else may differ.
            diff = await conn.run_sync(_diff)
            assert [d for d in diff if not _only_comment(d)] == []
    finally:
        await upgraded.aclose()
