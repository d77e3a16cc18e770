"""The ledger writer's ``then`` hook: what it queues goes out behind the event, in its pipeline
(the worker acknowledges a job that way). Real Redis; real SQL for the fallback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.accounting.writer import LedgerWriter
from gateway.coalescer import Coalescer
from tests.gateway.accounting.factories import make_entry


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
