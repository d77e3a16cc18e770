"""``tiergate ledger rollup`` and ``tiergate ledger verify`` on a real SQLite ledger and Redis."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from typer.testing import CliRunner

from gateway.accounting import SqlLedger
from gateway.cli.main import app
from tests.gateway.accounting.apps import EXAMPLE
from tests.gateway.accounting.factories import T0, make_entry


async def _book(url: str) -> None:
    ledger = await SqlLedger.connect(url)
    try:
        await ledger.record_many([make_entry("c1"), make_entry("c2", tags=("x",))])
    finally:
        await ledger.aclose()


def test_rollup_then_verify(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    asyncio.run(_book(url))
    env = {
        "TIERGATE_DATABASE__URL": url,
        "TIERGATE_REDIS__URL": redis_url,
        "TIERGATE_REDIS__KEY_PREFIX": key_prefix,
    }
    runner = CliRunner()
    verify = ["ledger", "verify", "--config", str(EXAMPLE)]
    before = runner.invoke(app, verify, env=env)
    assert before.exit_code == 1, before.output
    assert f"DIFFERENCE [rollups] {{'day': '{T0.date()}'" in before.output
    day = ["ledger", "rollup", "--config", str(EXAMPLE), "--day", T0.date().isoformat()]
    rolled = runner.invoke(app, day, env=env)
    assert rolled.exit_code == 0, rolled.output
    assert "2 rollup groups" in rolled.output
    after = runner.invoke(app, verify, env=env)
    assert after.exit_code == 0, after.output
    assert "ok: rows, rollups, true-up and stream agree" in after.output
    asyncio.run(_late(url))
    late = runner.invoke(app, verify, env=env)
    assert late.exit_code == 1
    assert "late" not in late.output  # differences name the group, not the request


async def _late(url: str) -> None:
    ledger = await SqlLedger.connect(url)
    try:
        await ledger.record(make_entry("late", created_at=T0 + timedelta(minutes=5)))
    finally:
        await ledger.aclose()
