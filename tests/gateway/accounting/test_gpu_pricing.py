"""Self-hosted prices from GPU $/h and measured pool throughput (shared through real Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
import redis.asyncio as aioredis

from backends.types import Usage
from gateway.accounting import Attempt, PriceBook
from gateway.accounting.prices import GpuCost, Price
from gateway.accounting.throughput import ThroughputMeter
from gateway.accounting.writer import LedgerWriter
from gateway.settings import DeploymentSettings
from tests.gateway.accounting.factories import make_entry


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


def test_rate_is_pool_cost_over_throughput() -> None:
    # 2 replicas x 2 GPUs x $2.50/h = $10/h; at 1000 tokens/s: 10 / 3.6e6 per token.
    book = PriceBook.from_settings([gpu_deployment()])
    cost = book.gpu_cost("llama-3.1-8b-instruct")
    assert cost == GpuCost(Decimal("10.00"))
    price = cost.price_at(1000.0)
    assert price.input_per_token == price.output_per_token == Decimal(10) / Decimal(3_600_000)
    assert price.source == "gpu"
    # a million tokens at 1000 tok/s take 1000 s of the pool: $10 x 1000/3600.
    usage = Usage(prompt_tokens=600_000, completion_tokens=400_000)
    assert abs(price.cost(usage) - Decimal(10) * 1000 / 3600) < Decimal("1e-20")


def test_fallback_until_measured_then_back() -> None:
    explicit = {"input_per_mtok": "0.03", "output_per_mtok": "0.06"}
    book = PriceBook.from_settings([gpu_deployment(price=explicit)])
    model = "llama-3.1-8b-instruct"
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=1_000_000)
    assert book.cost(model, usage) == Decimal("0.09")
    book.update_throughput({model: 2000.0})
    assert book.cost(model, usage) == Decimal(10) * 2_000_000 / (Decimal(3600) * 2000)
    book.update_throughput({model: None})
    assert book.cost(model, usage) == Decimal("0.09")


def test_no_fallback_is_unknown_not_zero() -> None:
    book = PriceBook.from_settings([gpu_deployment()])
    assert book.cost("llama-3.1-8b-instruct", Usage(prompt_tokens=5, completion_tokens=5)) is None


def test_zero_throughput_is_refused() -> None:
    with pytest.raises(ValueError):
        GpuCost(Decimal(1)).price_at(0.0)


async def test_meter_is_shared_and_windowed(redis: aioredis.Redis, key_prefix: str) -> None:
    clock = Clock(1_000_000.0)
    a = ThroughputMeter(redis, key_prefix, window_s=60, bucket_s=10, clock=clock)
    b = ThroughputMeter(redis, key_prefix, window_s=60, bucket_s=10, clock=clock)
    assert await a.tokens_per_s(["m"]) == {"m": None}
    await a.record({"m": 3000})
    clock.now += 15
    await b.record({"m": 3000, "other": 0})
    # 6000 tokens since the start of the first bucket, 15 s ago (two processes, one count).
    rates = await b.tokens_per_s(["m", "other"])
    assert rates["other"] is None
    assert rates["m"] == pytest.approx(6000 / 15)
    # Once both buckets have left the window there is no history.
    clock.now += 61
    assert await a.tokens_per_s(["m"]) == {"m": None}


async def test_meter_never_divides_by_less_than_a_bucket(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    clock = Clock(2_000_000.0)
    meter = ThroughputMeter(redis, key_prefix, window_s=60, bucket_s=10, clock=clock)
    await meter.record({"m": 500})
    assert (await meter.tokens_per_s(["m"]))["m"] == pytest.approx(50.0)


async def test_writer_meters_completed_gpu_attempts(
    redis: aioredis.Redis, key_prefix: str, ledger: Any
) -> None:
    clock = Clock(3_000_000.0)
    meter = ThroughputMeter(redis, key_prefix, window_s=60, bucket_s=10, clock=clock)
    book = PriceBook.from_settings([gpu_deployment()])
    writer = LedgerWriter(redis, f"{key_prefix}:ledger", ledger, meter=meter, prices=book)
    entry = make_entry(
        "r1",
        attempts=(
            Attempt("llama-3.1-8b-instruct", "timeout", 5.0, 0, 0),
            Attempt("llama-3.1-8b-instruct", "ok", 5.0, 700, 300),
            Attempt("gpt-4o-mini", "ok", 5.0, 100, 100),
        ),
    )
    await writer.write(entry)
    assert await redis.xlen(f"{key_prefix}:ledger") == 1
    # 1000 tokens in one 10 s bucket → 100 tok/s → $10/h ÷ 360 000 per token.
    assert book.price_of("llama-3.1-8b-instruct") == Price(
        Decimal(10) / Decimal(360_000), Decimal(10) / Decimal(360_000), "gpu"
    )
