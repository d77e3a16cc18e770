"""Schema migrations with Alembic, run when the ledger connects.

``upgrade`` brings a database to the newest revision under a lock (``pg_advisory_xact_lock`` on
PostgreSQL; SQLite serialises writers), so processes starting together do not race. A database
created before Alembic (it has ``ledger_entries`` but no version table) is stamped at the first
revision, which is exactly that schema, and then upgraded. Alembic's version table is
``tiergate_ledger_version`` so other parts of tiergate sharing the database can keep their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
from collections.abc import AsyncIterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "INITIAL_REVISION",
    "VERSION_TABLE",
    "current_revision",
    "head_revision",
    "sqlite_migration_lock",
    "upgrade",
]

VERSION_TABLE = "tiergate_ledger_version"
INITIAL_REVISION = "0001"
MIGRATION_LOCK_KEY = 0x7469_6572_6761_7465
_SCRIPTS = Path(__file__).resolve().parent / "migrations"


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def _upgrade(connection: Connection) -> None:
    config = _config(connection)
    tables = set(inspect(connection).get_table_names())
    if "ledger_entries" in tables and VERSION_TABLE not in tables:
        command.stamp(config, INITIAL_REVISION)
    command.upgrade(config, "head")


def _current(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


async def upgrade(conn: AsyncConnection) -> None:
    """Bring the database behind ``conn`` to the head revision (inside ``conn``'s transaction)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    await conn.run_sync(_upgrade)


@contextlib.asynccontextmanager
async def sqlite_migration_lock(database: str | None) -> AsyncIterator[None]:
    """Serialise migrations of one SQLite file across processes (an exclusive ``flock`` on a
    file beside it). SQLite's own locking starts only at the first write, after Alembic has
    already inspected the schema, so processes starting together could both try to create it."""
    if not database or database == ":memory:":
        yield
        return
    lock_path = Path(database).with_name(Path(database).name + ".migrate-lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a+b") as handle:
        await asyncio.to_thread(fcntl.flock, handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


async def current_revision(conn: AsyncConnection) -> str | None:
    return await conn.run_sync(_current)
