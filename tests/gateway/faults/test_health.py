"""The health probe drains a deployment whose replicas say they are down (or refuse) at once, and
one whose replicas are silent only after ``timeouts_to_drain`` checks in a row: a late probe does
not drain a healthy fleet. Real HTTP servers, a real Redis breaker (own key prefix)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from gateway.faults.breaker import BreakerState, RedisBreaker
from gateway.faults.health import HealthProbe
from tests.support import free_port


class Replica:
    """A ``/health`` endpoint answering ``status``, or nothing at all while ``silent``."""

    def __init__(self) -> None:
        self.status = 200
        self.silent = False
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None

    async def _health(self, _: web.Request) -> web.Response:
        if self.silent:
            await asyncio.sleep(30)
        return web.Response(status=self.status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Replica, Replica]]:
    pair = (Replica(), Replica())
    for replica in pair:
        await replica.start()
    yield pair
    for replica in pair:
        await replica.stop()


@pytest.fixture
async def breaker(redis_url: str, key_prefix: str) -> AsyncIterator[RedisBreaker]:
    client = aioredis.Redis.from_url(redis_url)
    yield RedisBreaker(client, key_prefix)
    await client.aclose()


async def _probe(
    breaker: RedisBreaker, urls: list[str], drained: list[str]
) -> AsyncIterator[HealthProbe]:
    async with aiohttp.ClientSession() as session:
        yield HealthProbe(
            session, breaker, {"d": urls}, timeout_s=0.2, timeouts_to_drain=2,
            on_down=drained.append,
        )  # fmt: skip


async def test_replicas_that_say_they_are_down_drain_at_once(
    replicas: tuple[Replica, Replica], breaker: RedisBreaker
) -> None:
    one, two = replicas
    drained: list[str] = []
    async for probe in _probe(breaker, [one.url, two.url], drained):
        assert await probe.check() == frozenset()
        one.status = 503
        assert await probe.check() == frozenset()  # the other replica is up
        await two.stop()  # refuses connections now
        assert await probe.check() == frozenset({"d"})
    assert drained == ["d"]
    assert await breaker.state("d") is BreakerState.OPEN


async def test_silent_replicas_drain_only_after_checks_in_a_row(
    replicas: tuple[Replica, Replica], breaker: RedisBreaker
) -> None:
    one, two = replicas
    drained: list[str] = []
    async for probe in _probe(breaker, [one.url, two.url], drained):
        one.silent = two.silent = True
        assert await probe.check() == frozenset()  # once: could be our own lateness
        one.silent = False
        assert await probe.check() == frozenset()  # an answer resets the count
        one.silent = True
        assert await probe.check() == frozenset()
        assert drained == [] and await breaker.state("d") is BreakerState.CLOSED
        two.silent, two.status = False, 503  # silent and down: still needs the second check
        assert await probe.check() == frozenset({"d"})
    assert drained == ["d"]
    assert await breaker.state("d") is BreakerState.OPEN


def test_timeouts_to_drain_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        HealthProbe(None, None, {}, timeouts_to_drain=0)  # type: ignore[arg-type]
