"""Alembic migrations on real SQLite and PostgreSQL: fresh databases, pre-Alembic databases."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, Index, MetaData, Table, inspect, text
from sqlalchemy.schema import CreateIndex, CreateTable

from gateway.accounting import SqlLedger
from gateway.accounting.ledger import entry_to_row
from gateway.accounting.migrate import (
    HEAD_REVISION,
    VERSION_TABLE,
    current_revision,
    head_revision,
)
from gateway.accounting.migrate import _config as migrate_config
from gateway.accounting.schema import ledger_entries, metadata
from tests.gateway.accounting.factories import T0, make_entry


def _diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return list(compare_metadata(context, metadata))


def _only_comment(item: Any) -> bool:
    return isinstance(item, list) and all(change[0] == "modify_comment" for change in item)


def test_head_revision_constant_is_alembics_head() -> None:
    # Bump HEAD_REVISION with every new migration: the connect-time check reads it.
    assert head_revision() == HEAD_REVISION


_ADDED = {
    "0003": ("idempotency_key",),
    "0004": ("estimated_micro_usd",),
    "0006": ("provisional", "superseded_at"),
    "0008": ("cost_nano_usd", "baseline_nano_usd", "price_source"),
    "0009": ("endpoint",),
}
"""Columns of ``ledger_entries`` added after revision 0002, by the revision that added them."""


def _skeleton(revision: str = "0002") -> Table:
    """``ledger_entries`` as ``revision`` has it (0001 and 0002: the skeleton's columns)."""
    later = {column for added, columns in _ADDED.items() if added > revision for column in columns}
    table = Table(
        "ledger_entries",
        MetaData(naming_convention=metadata.naming_convention),
        *(
            Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in ledger_entries.columns
            if c.name not in later
        ),
    )
    Index(None, table.c.tenant, table.c.created_at)
    Index(None, table.c.created_at)
    return table


def _old_row(table: Table, request_id: str) -> dict[str, Any]:
    row = entry_to_row(make_entry(request_id))
    return {k: v for k, v in row.items() if k in table.c}


def _upgrade_to(connection: Connection, revision: str) -> None:
    command.upgrade(migrate_config(connection), revision)


@pytest.mark.parametrize("start", ["0001", "0002", "0003", "0004", "0007"])
async def test_a_database_behind_head_is_upgraded_and_keeps_its_rows(
    db_url: str, start: str
) -> None:
    old = await SqlLedger.connect(db_url, migrate=False)
    try:
        await _drop_everything(old)
        skeleton = _skeleton(start)
        async with old.engine.begin() as conn:
            await conn.run_sync(_upgrade_to, start)
            await conn.execute(skeleton.insert(), [_old_row(skeleton, "before")])
    finally:
        await old.aclose()
    ledger = await SqlLedger.connect(db_url)
    try:
        async with ledger.engine.connect() as conn:
            assert await current_revision(conn) == HEAD_REVISION
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            assert {"ledger_daily", "gpu_trueup"} <= tables
            assert await conn.run_sync(_diff) == []
        before = await ledger.get("before")
        assert before is not None and before.idempotency_key is None
        assert before.estimated_micro_usd is None and not before.usage_estimated
        assert not before.provisional and before.superseded_at is None  # final, as booked
        # 0008: no nano-dollars or source stored; the cost reads exactly what was booked.
        assert (before.cost_nano_usd, before.price_source) == (None, None)
        assert before.cost_nano == before.cost_micro_usd * 1000  # type: ignore[operator]
        assert before.cost_usd == Decimal(before.cost_micro_usd or 0).scaleb(-6)
        keyed = make_entry("after", idempotency_key="k-1", created_at=T0 + timedelta(seconds=1))
        assert await ledger.record(keyed)
        assert await ledger.idempotent_request("acme", "k-1", T0) == "after"
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
        for name in (
            "budget_alerts",
            "ledger_dead_letters",
            "gpu_trueup",
            "ledger_daily",
            "ledger_entries",
            VERSION_TABLE,
        ):
            await conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


async def test_pre_alembic_database_is_stamped_and_upgraded(db_url: str) -> None:
    old = await SqlLedger.connect(db_url, migrate=False)
    try:
        await _drop_everything(old)
        # The skeleton's DDL, as it created databases before Alembic.
        skeleton = _skeleton()
        async with old.engine.begin() as conn:
            await conn.execute(CreateTable(skeleton))
            for index in skeleton.indexes:
                await conn.execute(CreateIndex(index))
            await conn.execute(skeleton.insert(), [_old_row(skeleton, "before-alembic")])
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


async def test_rollups_made_before_0005_read_no_estimated_cost(db_url: str) -> None:
    """0005 adds the estimated figures to ``ledger_daily`` without rewriting its rows: a rollup
    made before reads 0 until its day is rolled up again."""
    old = await SqlLedger.connect(db_url, migrate=False)
    try:
        await _drop_everything(old)
        async with old.engine.begin() as conn:
            await conn.run_sync(_upgrade_to, "0004")
            await conn.execute(
                text(
                    "INSERT INTO ledger_daily (day, tenant, deployment, tier, tag, requests, "
                    "prompt_tokens, completion_tokens, cost_micro_usd, baseline_micro_usd, "
                    "savings_micro_usd, unknown_price, unknown_baseline, rolled_up_at) VALUES "
                    "(:day, 'acme', 'm', 'small', '', 2, 200, 40, 60, 240, 180, 0, 0, :at)"
                ),
                {"day": T0.date(), "at": T0},
            )
    finally:
        await old.aclose()
    ledger = await SqlLedger.connect(db_url)
    try:
        async with ledger.engine.connect() as conn:
            assert await current_revision(conn) == HEAD_REVISION == "0009"
            assert await conn.run_sync(_diff) == []
            row = (
                await conn.execute(
                    text("SELECT requests, estimated, estimated_micro_usd FROM ledger_daily")
                )
            ).one()
        assert tuple(row) == (2, 0, 0)
    finally:
        await ledger.aclose()
