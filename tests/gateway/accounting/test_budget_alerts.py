"""Budget alerts over a real webhook server, real Redis and the SQL ledger (SQLite and
PostgreSQL): once per threshold crossed per window, retried, recorded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from sqlalchemy import select

from gateway.accounting import PriceBook, SqlLedger
from gateway.accounting.budget_alerts import BudgetAlerts
from gateway.accounting.budgets import BudgetBook
from gateway.accounting.schema import budget_alerts
from gateway.settings import BudgetSettings, load_settings
from tests.gateway.accounting.apps import EXAMPLE
from tests.gateway.accounting.factories import make_entry
from tests.support import free_port

AT = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@dataclass
class Hook:
    """A webhook that refuses its first call with a 503, then takes every one (Slack's shape: a
    JSON body with ``text``). Which alert was refused is kept: two processes race to send."""

    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    port = free_port()
    hook = Hook(url=f"http://127.0.0.1:{port}/hook")

    async def post(request: web.Request) -> web.Response:
        body = await request.json()
        if not hook.refused:
            hook.refused.append(body)
            return web.Response(status=503)
        hook.received.append(body)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", post)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield hook
    await runner.cleanup()


async def test_each_threshold_fires_once_per_window_retried_and_recorded(
    redis: aioredis.Redis, key_prefix: str, ledger: SqlLedger, hook: Hook
) -> None:
    budget = BudgetSettings(
        name="monthly", limit_usd="0.01", alert_at=(0.5, 0.8), webhook_url_env="ACME_HOOK"
    )
    env = {"ACME_HOOK": hook.url}
    prices = PriceBook.from_settings(load_settings(EXAMPLE).deployments, cost_map={})
    books = []
    async with contextlib.AsyncExitStack() as stack:
        alerts = []
        for _ in range(2):  # two processes settling the same tenant's requests
            sender = BudgetAlerts(ledger.engine, wait_s=0.01, environ=env.get)
            stack.push_async_callback(sender.aclose)
            alerts.append(sender)
            books.append(
                BudgetBook(redis, key_prefix, {"acme": (budget,)}, prices=prices, alerts=sender)
            )
        costs = [3_000, 2_500, 1_000, 2_000, 500, 100]  # 30 %, 55 %, 65 %, 85 %, 90 %, 91 %
        for i, cost in enumerate(costs):
            await books[i % 2].settle(make_entry(f"r{i}", created_at=AT, cost_micro_usd=cost))
        await asyncio.gather(*(a.drain() for a in alerts))
    assert sorted(m["threshold"] for m in hook.received) == [0.5, 0.8]  # once each
    first = next(m for m in hook.received if m["threshold"] == 0.5)
    assert "monthly" in first["text"] and "acme" in first["text"] and "50%" in first["text"]
    # The spend when the crossing was claimed: the first settlement past 50 % or a later one
    # (two processes race for the claim; the first to record it sends).
    assert first["limit_usd"] == "0.010000" and first["spent_usd"] in ("0.005500", "0.006500")
    async with ledger.engine.connect() as conn:
        rows = (await conn.execute(select(budget_alerts))).mappings().all()
    got = sorted((r["threshold"], r["status"], r["attempts"]) for r in rows)
    # The one the hook refused (whichever process sent first) was retried: two attempts.
    [refused] = [m["threshold"] for m in hook.refused]
    assert got == sorted((t, "sent", 2 if t == refused else 1) for t in (0.5, 0.8))


async def test_a_webhook_that_never_answers_is_recorded_failed(
    redis: aioredis.Redis, key_prefix: str, ledger: SqlLedger
) -> None:
    budget = BudgetSettings(
        name="weekly", limit_usd="1", window="7d", alert_at=(1.0,), webhook_url_env="HOOK"
    )
    dead = f"http://127.0.0.1:{free_port()}/nobody"
    sender = BudgetAlerts(ledger.engine, attempts=3, wait_s=0.01, environ={"HOOK": dead}.get)
    prices = PriceBook.from_settings(load_settings(EXAMPLE).deployments, cost_map={})
    book = BudgetBook(redis, key_prefix, {"acme": (budget,)}, prices=prices, alerts=sender)
    try:
        await book.settle(make_entry("big", created_at=AT, cost_micro_usd=1_000_000))
        await sender.drain()
    finally:
        await sender.aclose()
    async with ledger.engine.connect() as conn:
        (row,) = (await conn.execute(select(budget_alerts))).mappings().all()
    assert (row["status"], row["attempts"], row["threshold"]) == ("failed", 3, 1.0)
    assert row["error"]
