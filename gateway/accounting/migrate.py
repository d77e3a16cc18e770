"""Schema migrations with Alembic, run when the ledger connects.

``upgrade`` brings a database to the newest revision under a lock (``pg_advisory_xact_lock`` on
PostgreSQL; SQLite serialises writers), so processes starting together do not race. A database
created before Alembic (it has ``ledger_entries`` but no version table) is stamped at the first
revision, which is exactly that schema, and then upgraded. Alembic's version table is
``tiergate_ledger_version`` so other parts of tiergate sharing the database can keep their own.

Alembic is imported only when there is something to do: a database already at ``HEAD_REVISION``
(read from the version table with SQLAlchemy, under the same lock) is left alone without it,
which keeps Alembic (about 9 MB resident) out of a serving process. ``HEAD_REVISION`` is checked
against the migration scripts by a test; bump it with every new migration.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, column, inspect, select, table, text
from sqlalchemy.ext.asyncio import AsyncConnection

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "HEAD_REVISION",
    "INITIAL_REVISION",
    "VERSION_TABLE",
    "current_revision",
    "head_revision",
    "sqlite_migration_lock",
    "upgrade",
]

log = logging.getLogger(__name__)

VERSION_TABLE = "tiergate_ledger_version"
INITIAL_REVISION = "0001"
HEAD_REVISION = "0009"
"""The newest revision in ``migrations/versions`` (a test compares it with Alembic's head)."""
MIGRATION_LOCK_KEY = 0x7469_6572_6761_7465
_SCRIPTS = Path(__file__).resolve().parent / "migrations"


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The head revision according to Alembic's script directory (imports Alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def _at_head(connection: Connection, tables: set[str]) -> bool:
    """Whether the version table holds exactly ``HEAD_REVISION`` (read without Alembic)."""
    if VERSION_TABLE not in tables:
        return False
    versions = table(VERSION_TABLE, column("version_num"))
    return list(connection.execute(select(versions.c.version_num)).scalars()) == [HEAD_REVISION]


def _upgrade(connection: Connection) -> None:
    tables = set(inspect(connection).get_table_names())
    if _at_head(connection, tables):
        return
    from alembic import command

    config = _config(connection)
    if "ledger_entries" in tables and VERSION_TABLE not in tables:
        command.stamp(config, INITIAL_REVISION)
    before = _current(connection)
    command.upgrade(config, "head")
    log.info("ledger database migrated from %s to %s", before or "empty", HEAD_REVISION)


def _current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

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
    """The database's revision according to Alembic (imports Alembic)."""
    return await conn.run_sync(_current)
