"""Self-hosted prices from GPU $/h: one rate per pricing period, from the pool's recorded cost and
tokens of the period before last, bounded, published a period ahead (real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from backends.types import Usage
from gateway.accounting import Attempt, PriceBook
from gateway.accounting.gpu_rates import GpuRates, ReplicaClock
from gateway.accounting.prices import GpuCost, Price
from gateway.accounting.writer import LedgerWriter
from gateway.settings import DeploymentSettings
from tests.gateway.accounting.factories import make_entry
from tests.support import free_port


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gpu_deployment(**overrides: Any) -> DeploymentSettings:
    values: dict[str, Any] = {
        "model": "llama-3.1-8b-instruct",
        "tier": "small",
        "replicas": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}],
        "gpu_hourly_usd": "2.50",
        "gpus_per_replica": 2,
    }
    values.update(overrides)
    return DeploymentSettings(**values)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


DAY = 86_400
T0 = 20_000 * DAY + 3600.0  # 01:00 UTC of some day
MODEL = "llama-3.1-8b-instruct"


def book_and_rates(
    redis: aioredis.Redis, prefix: str, clock: Clock, **overrides: Any
) -> tuple[PriceBook, GpuRates]:
    book = PriceBook.from_settings([gpu_deployment(**overrides)])
    rates = GpuRates(redis, prefix, book.gpu_pools, clock=clock)
    book.attach_rates(rates)
    return book, rates


def test_pool_cost_is_per_replica_times_configured_replicas() -> None:
    # 2 replicas x 2 GPUs x $2.50/h = $10/h
    book = PriceBook.from_settings([gpu_deployment()])
    assert book.gpu_cost(MODEL) == GpuCost(Decimal("10.00"))
    (pool,) = book.gpu_pools
    assert pool.replica_hourly_usd == Decimal("5.00")
    assert pool.planned_per_token is None


async def test_no_history_no_plan_no_price_is_unknown_not_zero(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    book, _ = book_and_rates(redis, key_prefix, Clock(T0))
    await book.ensure_rates(T0)
    assert book.cost(MODEL, Usage(prompt_tokens=5, completion_tokens=5), T0) is None
    rate = book.gpu_rate(MODEL, T0)
    assert rate is not None and rate.basis == "unknown"


async def test_planned_rate_then_explicit_price_without_history(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    explicit = {"input_per_mtok": "0.03", "output_per_mtok": "0.06"}
    book, _ = book_and_rates(redis, key_prefix, Clock(T0), price=explicit)
    await book.ensure_rates(T0)
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=1_000_000)
    assert book.cost(MODEL, usage, T0) == Decimal("0.09")
    assert book.price_of(MODEL, T0).source.startswith(f"gpu-rate {MODEL}@")  # type: ignore[union-attr]
    planned, _ = book_and_rates(redis, key_prefix + ":p", Clock(T0), gpu_expected_tokens_per_s=1000)
    await planned.ensure_rates(T0)
    # $10/h at 1000 tokens/s: $10 / 3.6M tokens, input and output alike.
    per_token = Decimal(10) / Decimal(3_600_000)
    assert planned.price_of(MODEL, T0) == Price(
        per_token,
        per_token,
        planned.gpu_rate(MODEL, T0).source,  # type: ignore[union-attr]
    )


async def test_the_rate_is_measured_on_the_period_before_last_and_stable_across_idle(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    """Day D-2: replicas recorded running 36,000 replica-seconds ($50 at $5/replica-h) and 10M
    tokens served: every request received on day D is priced $5/Mtok, whatever the traffic of
    day D (an idle morning, then a burst), and every process reads the same rate."""
    clock = Clock(T0 - 2 * DAY)
    book, rates = book_and_rates(redis, key_prefix, clock, gpu_expected_tokens_per_s=1000)
    for i in range(3600):  # two replicas seen every 10 s for 5 hours
        await rates.record_running(MODEL, ["r1", "r2"], bucket_s=10, at=T0 - 2 * DAY + 5 * i)
    await rates.record_tokens({MODEL: 10_000_000}, at=T0 - 2 * DAY + 60)
    clock.now = T0 - DAY
    await book.ensure_rates(clock.now)  # day D's rate is published during day D-1
    ahead = book.gpu_rate(MODEL, T0)
    assert ahead is not None and ahead.basis == "measured"
    assert ahead.window_replica_s == 36_000 and ahead.window_tokens == 10_000_000
    assert ahead.input_per_token == ahead.output_per_token == Decimal(50) / 10_000_000
    other, _ = book_and_rates(redis, key_prefix, Clock(T0 + 5 * 3600))
    for at in (T0, T0 + 5 * 3600, T0 - 3600 + DAY - 1):  # idle hours, then a burst
        await rates.record_tokens({MODEL: 1_000_000}, at=at)
        await other.ensure_rates(at)
        assert other.gpu_rate(MODEL, at) == ahead
    assert ahead.source == (
        f"gpu-rate {MODEL}@{ahead.period_start:%Y-%m-%dT%H:%MZ} (measured; window "
        f"{ahead.window_start:%Y-%m-%dT%H:%MZ}/{ahead.window_end:%Y-%m-%dT%H:%MZ})"
    )


async def test_a_measured_rate_is_bounded(redis: aioredis.Redis, key_prefix: str) -> None:
    """An idle period before last (a few tokens on a day of GPU time) would make a huge rate:
    it is capped at ``gpu_rate_max_per_mtok``."""
    clock = Clock(T0 - 2 * DAY)
    book, rates = book_and_rates(redis, key_prefix, clock, gpu_rate_max_per_mtok="2")
    await rates.record_running(MODEL, ["r1"], bucket_s=10, at=T0 - 2 * DAY)
    await rates.record_tokens({MODEL: 13}, at=T0 - 2 * DAY)
    await book.ensure_rates(T0)
    rate = book.gpu_rate(MODEL, T0)
    assert rate is not None and rate.basis == "measured, capped at max"
    assert rate.input_per_token == Decimal("0.000002")


async def test_replicas_are_counted_once_per_bucket_whoever_sees_them(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    _, a = book_and_rates(redis, key_prefix, Clock(T0))
    _, b = book_and_rates(redis, key_prefix, Clock(T0))
    assert await a.record_running(MODEL, ["r1", "r2"], bucket_s=10, at=T0) == 20
    assert await b.record_running(MODEL, ["r1"], bucket_s=10, at=T0 + 4) == 0
    assert await b.record_running(MODEL, ["r1"], bucket_s=10, at=T0 + 10) == 10
    day = datetime.fromtimestamp(T0, UTC).date()
    assert await a.replica_seconds_of_day(MODEL, day) == 30


async def test_replica_clock_records_only_replicas_that_answer_health(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    app = web.Application()

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        _, rates = book_and_rates(redis, key_prefix, Clock(T0))
        async with aiohttp.ClientSession() as session:
            clock = ReplicaClock(
                rates,
                session,
                {MODEL: [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"]},
            )
            assert await clock.sample() == {MODEL: 10}
            # Running, it also keeps the price book's rates read (a worker idle for periods).
            refreshed: list[bool] = []

            async def refresh() -> None:
                refreshed.append(True)

            running = ReplicaClock(
                rates, session, {MODEL: [f"http://127.0.0.1:{port}"]}, sample_s=0.02,
                refresh=refresh,
            )  # fmt: skip
            running.start()
            await asyncio.sleep(0.3)
            await running.aclose()
            assert len(refreshed) >= 2
    finally:
        await runner.cleanup()


async def test_writer_counts_completed_gpu_attempts(
    redis: aioredis.Redis, key_prefix: str, ledger: Any
) -> None:
    clock = Clock(T0)
    book, rates = book_and_rates(redis, key_prefix, clock)
    writer = LedgerWriter(redis, f"{key_prefix}:ledger", ledger, rates=rates, prices=book)
    entry = make_entry(
        "r1",
        attempts=(
            Attempt(MODEL, "timeout", 5.0, 0, 0),
            Attempt(MODEL, "ok", 5.0, 700, 300),
            Attempt("gpt-4o-mini", "ok", 5.0, 100, 100),
        ),
    )
    await writer.write(entry)
    (pool,) = book.gpu_pools
    tokens = await redis.get(f"{key_prefix}:{{gpu:{MODEL}}}:ptok:{pool.period(clock.now)}")
    assert tokens is not None and int(tokens) == 1000
