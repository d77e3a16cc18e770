"""The ledger writer's ``then`` hook: what it queues goes out behind the event, in its pipeline
(the worker acknowledges a job that way). Real Redis; real SQL for the fallback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.accounting.budgets import BudgetBook
from gateway.accounting.prices import PriceBook
from gateway.accounting.writer import LedgerWriter
from gateway.coalescer import Coalescer
from gateway.queue.client.connection import redis_client
from gateway.settings import BudgetSettings, load_settings
from tests.gateway.accounting.apps import EXAMPLE
from tests.gateway.accounting.factories import make_entry
from tests.support import RedisServer


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_then_runs_while_the_event_is_still_queued_and_goes_out_behind_it(
    redis: aioredis.Redis, key_prefix: str, ledger: Any
) -> None:
    coalescer = Coalescer(redis)
    stream, after = f"{key_prefix}:ledger", f"{key_prefix}:after"
    writer = LedgerWriter(redis, stream, ledger, coalescer=coalescer)
    queued_with_the_event: list[int] = []

    def then() -> None:
        queued_with_the_event.append(coalescer.pending)
        coalescer.send_nowait(lambda pipe: pipe.set(after, b"1"), "after")

    try:
        await writer.write(make_entry("r1"), then=then)
        await coalescer.flush()
    finally:
        await coalescer.aclose()
    assert queued_with_the_event == [1]  # the event itself: one pipeline for both
    assert await redis.xlen(stream) == 1
    assert await redis.get(after) == b"1"
    assert await ledger.get("r1") is None  # on the stream, not written to SQL here


async def test_without_a_coalescer_then_is_not_called_and_the_caller_acks_itself(
    redis: aioredis.Redis, key_prefix: str, ledger: Any
) -> None:
    writer = LedgerWriter(redis, f"{key_prefix}:ledger", ledger)
    called: list[bool] = []
    await writer.write(make_entry("r2"), then=lambda: called.append(True))
    assert called == []
    assert await redis.xlen(f"{key_prefix}:ledger") == 1


async def test_with_redis_down_the_entry_goes_to_sql(ledger: Any) -> None:
    down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    coalescer = Coalescer(down)
    writer = LedgerWriter(down, "tgtest-down:ledger", ledger, coalescer=coalescer)
    try:
        await writer.write(make_entry("r3"), then=lambda: None)
    finally:
        await coalescer.aclose()
        await down.aclose()
    assert await ledger.get("r3") is not None


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


async def test_a_settlement_redis_cannot_take_is_made_once_it_answers_again(
    own_redis: RedisServer, ledger: Any
) -> None:
    """Redis stops answering (paused, its data kept, as in a failover): the entry goes to SQL,
    its settlement is kept and made before the next entry's, so the hard budget's ``spent``
    holds both real costs and nothing stays reserved (not only a release at the sweep)."""
    redis = redis_client(own_redis.url, socket_timeout=0.3)
    admin = aioredis.Redis.from_url(own_redis.url)
    prices = PriceBook.from_settings(load_settings(EXAMPLE).deployments, cost_map={})
    budgets = BudgetBook(
        redis, "tgw", {"acme": (BudgetSettings(name="m", limit_usd=Decimal(1)),)}, prices=prices
    )
    writer = LedgerWriter(redis, "tgw:ledger", ledger, budgets=budgets)
    at = datetime.now(UTC)
    first, second = make_entry("w1", created_at=at), make_entry("w2", created_at=at)
    try:
        for entry in (first, second):
            await budgets.reserve(
                tenant="acme", request_id=entry.request_id, app=None, tags=(),
                amount_micro_usd=5_000, at=at,
            )  # fmt: skip
        await admin.execute_command("CLIENT", "PAUSE", "1000", "ALL")
        await writer.write(first)  # times out on Redis: to SQL, its settlement kept
        assert await ledger.get("w1") is not None
        assert writer.pending_settlements == 1
        await asyncio.sleep(1.0)  # the pause is over
        await writer.write(second)
        assert writer.pending_settlements == 0
        (status,) = await budgets.status("acme", at)
        assert (status.spent_micro_usd, status.reserved_micro_usd) == (
            first.cost_micro_usd + second.cost_micro_usd,
            0,
        )
    finally:
        await redis.aclose()
        await admin.aclose()
