"""Tables created at connect, from several processes at once (edges and workers start together)."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
from pathlib import Path

from sqlalchemy import inspect

from gateway.auth.store import SqlAuthStore
from gateway.rules.store import SqlRuleStore
from gateway.sqlengine import create_sql_engine

STARTERS = 6


def _connect_all(url: str, start: multiprocessing.synchronize.Barrier) -> None:
    async def run() -> None:
        start.wait()
        rules = await SqlRuleStore.connect(url)
        auth = await SqlAuthStore.connect(url)
        await rules.aclose()
        await auth.aclose()

    asyncio.run(run())


def test_many_processes_create_the_same_sqlite_tables_together(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(STARTERS)
    procs = [context.Process(target=_connect_all, args=(url, start)) for _ in range(STARTERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * STARTERS

    async def tables() -> set[str]:
        engine = create_sql_engine(url)
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
        await engine.dispose()
        return names

    assert {"rule_versions", "tenants", "api_keys"} <= asyncio.run(tables())
