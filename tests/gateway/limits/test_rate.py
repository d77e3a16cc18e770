"""Rate limits on a real Redis: atomic across limiter instances (gateway processes), and rebuilt
from the SQL ledger (SQLite and PostgreSQL) after Redis lost its data."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.accounting import SqlLedger
from gateway.errors import RateLimited
from gateway.limits.rate import RateLimiter, RateUsageSource, TenantRates, replay_level
from tests.gateway.accounting.factories import make_entry
from tests.gateway.limits.conftest import lose_redis
from tests.support import free_port


@pytest.fixture
async def two_clients(redis_url: str) -> AsyncIterator[list[aioredis.Redis]]:
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
    yield clients
    for c in clients:
        await c.aclose()


async def _admit(limiter: RateLimiter, tenant: str, tokens: int) -> float | None:
    try:
        await limiter.admit(tenant, tokens=tokens)
    except RateLimited as exc:
        return exc.retry_after
    return None


async def test_requests_per_minute_hold_across_processes(
    two_clients: list[aioredis.Redis], key_prefix: str
) -> None:
    rates = {"acme": TenantRates(requests_per_minute=20)}
    limiters = [RateLimiter(c, key_prefix, rates) for c in two_clients]
    results = await asyncio.gather(*(_admit(limiters[i % 2], "acme", 1) for i in range(60)))
    assert sum(1 for r in results if r is None) == 20
    refusals = [r for r in results if r is not None]
    assert all(1.0 <= r <= 4.0 for r in refusals)  # one request refills in 3 s
    # another tenant, and a tenant without limits, are not affected
    assert await _admit(limiters[0], "globex", 10**9) is None


async def test_tokens_per_minute_and_all_or_nothing(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    limiter = RateLimiter(
        redis_conn, key_prefix, {"t": TenantRates(requests_per_minute=100, tokens_per_minute=1000)}
    )
    assert await _admit(limiter, "t", 600) is None
    wait = await _admit(limiter, "t", 600)  # 400 left: refused, waits for ~200 tokens (12 s)
    assert wait is not None and 11 <= wait <= 14
    assert await _admit(limiter, "t", 400) is None  # the refusal took nothing
    assert await _admit(limiter, "t", 50) is not None


async def test_limits_are_read_at_every_check(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    """The limiter keeps the caller's mapping (``TenantDirectory.rates`` in the gateway), so a
    tenant's new limit applies to its next request; its bucket keeps its level."""
    rates = {"umbrella": TenantRates(requests_per_minute=2)}
    limiter = RateLimiter(redis_conn, key_prefix, rates)
    assert await _admitted(limiter, "umbrella", 3) == 2
    rates["umbrella"] = TenantRates(requests_per_minute=6000)  # 100 a second
    await asyncio.sleep(0.05)
    assert await _admit(limiter, "umbrella", 1) is None
    rates["umbrella"] = TenantRates(requests_per_minute=1)  # the level is capped at once
    assert await _admitted(limiter, "umbrella", 3) == 1
    del rates["umbrella"]  # no limit any more
    assert await _admitted(limiter, "umbrella", 5) == 5


# --- after a Redis loss: buckets rebuilt from the SQL ledger ----------------------------------


@pytest.mark.parametrize(
    ("charges", "now", "level"),
    [
        ([], 60.0, 60.0),  # nothing charged: full
        ([(0.0, 60)], 30.0, 30.0),  # emptied at the start, half a minute of refill
        ([(50.0, 10), (50.0, 10)], 60.0, 50.0),  # refill while full is lost
        ([(10.0, 100)], 10.0, 0.0),  # a charge over the limit empties it, never below zero
        ([(-5.0, 30)], 0.0, 30.0),  # a row from before the window counts at its start
    ],
)
def test_replay_level(charges: list[tuple[float, int]], now: float, level: float) -> None:
    assert replay_level(60, charges, start=0.0, now=now) == pytest.approx(level)


class CountingUsage:
    """The real ledger, with its rebuild queries counted."""

    def __init__(self, ledger: RateUsageSource) -> None:
        self.ledger = ledger
        self.calls = 0

    async def rate_usage(
        self, tenant: str, start: datetime, end: datetime
    ) -> list[tuple[datetime, int]]:
        self.calls += 1
        return await self.ledger.rate_usage(tenant, start, end)


async def _book_last_second(ledger: SqlLedger, n: int, **overrides: Any) -> None:
    overrides.setdefault("created_at", datetime.now(UTC) - timedelta(seconds=1))
    await ledger.record_many([make_entry(uuid.uuid4().hex, **overrides) for _ in range(n)])


async def _admitted(limiter: RateLimiter, tenant: str, n: int, tokens: int = 1) -> int:
    results = await asyncio.gather(*(_admit(limiter, tenant, tokens) for _ in range(n)))
    return sum(1 for r in results if r is None)


async def test_after_a_redis_loss_buckets_are_rebuilt_from_the_ledger(
    redis_conn: aioredis.Redis, key_prefix: str, sql_ledger: SqlLedger
) -> None:
    rates = {"acme": TenantRates(requests_per_minute=12), "globex": TenantRates(12)}
    limiter = RateLimiter(redis_conn, key_prefix, rates, ledger=sql_ledger)
    assert await _admitted(limiter, "acme", 10) == 10
    # what the sink booked for those ten; rows the limits never charged do not count
    await _book_last_second(sql_ledger, 10)
    await _book_last_second(sql_ledger, 3, outcome="rate_limit_exceeded", status_code=429)
    await _book_last_second(sql_ledger, 4, outcome="invalid_request", status_code=400, tier=None)
    await _book_last_second(sql_ledger, 12, tenant="globex")
    await _book_last_second(sql_ledger, 12, created_at=datetime.now(UTC) - timedelta(seconds=70))

    assert await lose_redis(redis_conn, key_prefix) > 0
    again = RateLimiter(redis_conn, key_prefix, rates, ledger=sql_ledger)  # another process
    # 12 - 10 + one second of refill (0.2): two more, not a fresh twelve
    assert await _admitted(again, "acme", 12) == 2
    # another tenant is rebuilt from its own rows
    assert await _admitted(again, "globex", 12) == 0


async def test_tokens_are_rebuilt_from_the_actual_usage(
    redis_conn: aioredis.Redis, key_prefix: str, sql_ledger: SqlLedger
) -> None:
    rates = {"acme": TenantRates(requests_per_minute=1000, tokens_per_minute=6000)}
    await _book_last_second(sql_ledger, 5, prompt_tokens=900, completion_tokens=100)
    limiter = RateLimiter(redis_conn, key_prefix, rates, ledger=sql_ledger)
    # 6000 - 5000 + about 100 refilled: 1000 fit, 1300 do not (and take nothing)
    assert await _admit(limiter, "acme", 1300) is not None
    assert await _admit(limiter, "acme", 1000) is None


async def test_a_burst_after_a_loss_queries_the_ledger_once(
    two_clients: list[aioredis.Redis], key_prefix: str, sql_ledger: SqlLedger
) -> None:
    rates = {"acme": TenantRates(requests_per_minute=120)}
    await _book_last_second(sql_ledger, 100)
    usage = CountingUsage(sql_ledger)
    limiters = [RateLimiter(c, key_prefix, rates, ledger=usage) for c in two_clients]
    results = await asyncio.gather(*(_admit(limiters[i % 2], "acme", 1) for i in range(60)))
    admitted = sum(1 for r in results if r is None)
    assert 22 <= admitted <= 25, admitted  # 20 left + 2/s of refill, not 60
    assert usage.calls == 1
    # while the marker lives, a bucket that expired (an idle tenant) is full again, no query
    await two_clients[0].delete(*limiters[0]._keys("acme")[:2])
    assert await _admitted(limiters[0], "acme", 5) == 5
    assert usage.calls == 1


async def test_sql_down_during_a_rebuild_admits_as_before(
    redis_conn: aioredis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a real ledger whose PostgreSQL cannot be reached (nothing listens on the port)
    down = await SqlLedger.connect(
        f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/test", migrate=False
    )
    usage = CountingUsage(down)
    try:
        limiter = RateLimiter(
            redis_conn, key_prefix, {"acme": TenantRates(requests_per_minute=5)}, ledger=usage
        )
        with caplog.at_level(logging.WARNING, logger="gateway.limits.rate"):
            assert await _admitted(limiter, "acme", 8) == 5  # a full bucket, as without rebuilds
        assert "not rebuilt from the ledger" in caplog.text
        assert usage.calls == 1  # marked as seeded: no retry per request
    finally:
        await down.aclose()
