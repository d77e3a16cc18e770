"""Real databases for the accounting tests: SQLite in a temp dir, and PostgreSQL.

The PostgreSQL server is ``TIERGATE_TEST_DATABASE_URL`` (default: local trust auth). Each session
creates its own ``tg_test_<random>`` database there and drops it at the end, so parallel runs do
not collide. If the server cannot be reached the PostgreSQL tests fail; they are never skipped.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from gateway.accounting import SqlLedger

DEFAULT_PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_SESSION_TIMEZONE = "America/New_York"
"""Not UTC, so a report that leans on the server's time zone shows it."""

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _asyncpg_dsn(sqlalchemy_url: str, database: str | None = None) -> str:
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    if database is not None:
        url = url.set(database=database)
    return url.render_as_string(hide_password=False)


async def _admin(sqlalchemy_url: str, statement: str) -> None:
    # The server's own database is the maintenance connection when the named one may not exist.
    conn = await asyncpg.connect(_asyncpg_dsn(sqlalchemy_url, "postgres"), timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    base = os.environ.get("TIERGATE_TEST_DATABASE_URL", DEFAULT_PG_URL)
    name = f"tg_test_{secrets.token_hex(6)}"
    asyncio.run(_admin(base, f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[SqlLedger]:
    kwargs: dict[str, Any] = {}
    if db_url.startswith("postgresql"):
        kwargs["connect_args"] = {"server_settings": {"timezone": PG_SESSION_TIMEZONE}}
    ledger = await SqlLedger.connect(db_url, **kwargs)
    try:
        if ledger.dialect == "postgresql":
            async with ledger.engine.begin() as conn:
                await conn.execute(
                    text(
                        "TRUNCATE ledger_entries, ledger_daily, gpu_trueup, ledger_dead_letters, "
                        "budget_alerts"
                    )
                )
        yield ledger
    finally:
        await ledger.aclose()
