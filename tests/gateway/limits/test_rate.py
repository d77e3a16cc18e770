"""Rate limits on a real Redis: atomic across limiter instances (gateway processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.errors import RateLimited
from gateway.limits.rate import RateLimiter, TenantRates


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
