"""Drain on failed health: a vLLM deployment whose replicas all fail ``GET /health`` (a spot GPU
being reclaimed, a server shutting down) has its breaker opened at once, in every process, and
re-opened every check while it stays down; once healthy again, the breaker's half-open probe
lets traffic back. The non-streamed calls already waiting on it end at once and are retried
elsewhere (``gateway/faults/drain.py``).

Hosted APIs have no health endpoint: only ``vllm`` deployments are checked. Queued jobs keep
their plans; when a worker runs one, the open breaker makes it skip the drained deployment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

import aiohttp

from gateway.faults.breaker import RedisBreaker
from gateway.tasks import stop_task

__all__ = ["HealthProbe", "health_url"]

log = logging.getLogger(__name__)


def health_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return (base.removesuffix("/v1") or base) + "/health"


class HealthProbe:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        breaker: RedisBreaker,
        replicas: Mapping[str, Sequence[str]],
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        on_down: Callable[[str], object] | None = None,
    ) -> None:
        """``on_down(deployment)`` is called for a drained deployment after its breaker opened
        (``InflightCalls.drain``: the calls waiting on it end and are retried elsewhere)."""
        self._session = session
        self._breaker = breaker
        self._replicas = {d: tuple(urls) for d, urls in replicas.items() if urls}
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._on_down = on_down
        self._task: asyncio.Task[None] | None = None

    async def _healthy(self, base_url: str) -> bool:
        try:
            async with self._session.get(health_url(base_url), timeout=self._timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError):
            return False

    async def check(self) -> frozenset[str]:
        """Check every deployment once; the ones drained (all replicas down)."""
        down: set[str] = set()
        for deployment, urls in self._replicas.items():
            results = await asyncio.gather(*(self._healthy(u) for u in urls))
            if not any(results):
                down.add(deployment)
                await self._breaker.trip(deployment)
                if self._on_down is not None:
                    self._on_down(deployment)
        return frozenset(down)

    async def _loop(self) -> None:
        while True:
            try:
                down = await self.check()
                if down:
                    log.warning("failing health, drained: %s", ", ".join(sorted(down)))
            except Exception:  # a background checker must not die
                log.exception("health check failed")
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="health-probe")

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
