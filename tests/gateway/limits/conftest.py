"""The queue tests' fixtures (real Redis client, simulator replicas), shared with the limits, and
a ledger on each SQL database for the rebuilds after a Redis loss."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.accounting import SqlLedger
from tests.gateway.queue.conftest import redis_conn, start_sim

__all__ = ["lose_redis", "redis_conn", "sql_ledger", "start_sim"]


async def lose_redis(redis: aioredis.Redis, prefix: str) -> int:
    """What a Redis that lost its data looks like to one deployment: every key of ``prefix``
    gone (the test's own prefix, so the shared server's other keys stay). Keys deleted."""
    keys = [key async for key in redis.scan_iter(match=f"{prefix}:*", count=1000)]
    return int(await redis.delete(*keys)) if keys else 0


@pytest.fixture
async def sql_ledger(store_url: str) -> AsyncIterator[SqlLedger]:
    """A migrated ledger on SQLite, then (marker ``postgres``) on a PostgreSQL database of the
    test's own."""
    ledger = await SqlLedger.connect(store_url)
    try:
        yield ledger
    finally:
        await ledger.aclose()
