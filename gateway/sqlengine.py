"""The SQL engine every store opens (ledger, tenants and keys, rule versions): SQLite by default,
PostgreSQL in production. SQLite runs in WAL mode with a busy timeout so the gateway and a separate
worker process can write the same file at once.

A leaf: it imports nothing of ours, so a store takes its engine from here and not from another
store (``tests/test_layering.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "create_sql_engine"]

SQLITE_BUSY_TIMEOUT_MS = 10_000
_DIALECTS = ("sqlite", "postgresql")


def create_sql_engine(url: str | URL, **engine_kwargs: Any) -> AsyncEngine:
    """An async engine for ``url`` for our stores (SQLite: WAL, busy timeout, parent dir)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend not in _DIALECTS:
        raise ValueError(f"unsupported ledger database {backend!r}: use sqlite or postgresql")
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            # One shared connection, or every connection would see its own empty database.
            engine_kwargs.setdefault("poolclass", StaticPool)
        else:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
    else:
        engine_kwargs.setdefault("pool_pre_ping", True)
    engine = create_async_engine(parsed, **engine_kwargs)
    if backend == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()
