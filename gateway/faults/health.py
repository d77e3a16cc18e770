"""Drain on failed health: a vLLM deployment whose replicas all fail ``GET /health`` (a spot GPU
being reclaimed, a server shutting down) has its breaker opened at once, in every process, and
re-opened every check while it stays down; once healthy again, the breaker's half-open probe
lets traffic back. The non-streamed calls already waiting on it end at once and are retried
elsewhere (``gateway/faults/drain.py``).

A replica fails a check when it answers anything but 200 or refuses the connection: that is the
server saying so, and drains at once. A replica that does not answer within the timeout is
*silent*, which is ambiguous: a hung server, or a probe delayed by this process's own busy event
loop or a network blip. Draining is fleet-wide and aborts calls in flight, so a deployment with
no healthy replica and a silent one is drained only after ``timeouts_to_drain`` such checks in a
row; a probe that was merely late does not drain a healthy deployment.

Hosted APIs have no health endpoint: only ``vllm`` deployments are checked. Queued jobs keep
their plans; when a worker runs one, the open breaker makes it skip the drained deployment.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping, Sequence

import aiohttp

from gateway.faults.breaker import RedisBreaker
from gateway.loops import Loop

__all__ = ["Health", "HealthProbe", "health_url"]

log = logging.getLogger(__name__)


class Health(enum.Enum):
    """One replica's answer to one check."""

    UP = "up"
    DOWN = "down"
    """Answered, but not 200; or refused the connection."""
    SILENT = "silent"
    """No answer within the timeout."""


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
        timeouts_to_drain: int = 2,
        on_down: Callable[[str], object] | None = None,
    ) -> None:
        """``on_down(deployment)`` is called for a drained deployment after its breaker opened
        (``InflightCalls.drain``: the calls waiting on it end and are retried elsewhere);
        ``timeouts_to_drain``: checks in a row with no healthy replica and a silent one before
        a drain."""
        if timeouts_to_drain < 1:
            raise ValueError(f"timeouts_to_drain must be at least 1, not {timeouts_to_drain}")
        self._session = session
        self._breaker = breaker
        self._replicas = {d: tuple(urls) for d, urls in replicas.items() if urls}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._timeouts_to_drain = timeouts_to_drain
        self._silent_checks: dict[str, int] = {}
        self._on_down = on_down
        self._loop = Loop(  # a background checker must not die
            "health-probe",
            self._check_and_log,
            every_s=interval_s,
            catch=(Exception,),
            on_error=lambda exc: log.error("health check failed", exc_info=exc),
        )

    def set_replicas(self, deployment: str, urls: Sequence[str]) -> None:
        """``deployment``'s replicas from now on (discovered pods joined or left). A deployment
        with none is not checked: there is nothing to drain."""
        if urls:
            self._replicas[deployment] = tuple(urls)
        else:
            self._replicas.pop(deployment, None)
            self._silent_checks.pop(deployment, None)

    async def _probe(self, base_url: str) -> Health:
        try:
            async with self._session.get(health_url(base_url), timeout=self._timeout) as resp:
                return Health.UP if resp.status == 200 else Health.DOWN
        except TimeoutError:  # aiohttp's timeouts are TimeoutErrors too: before ClientError
            return Health.SILENT
        except (aiohttp.ClientError, OSError):
            return Health.DOWN

    def _drains(self, deployment: str, results: Sequence[Health]) -> bool:
        if Health.UP in results:
            self._silent_checks.pop(deployment, None)
            return False
        if Health.SILENT not in results:
            return True  # every replica said so
        silent = self._silent_checks.get(deployment, 0) + 1
        self._silent_checks[deployment] = silent
        return silent >= self._timeouts_to_drain

    async def check(self) -> frozenset[str]:
        """Check every deployment once; the ones drained (no replica up: all down, or silent
        for ``timeouts_to_drain`` checks in a row)."""
        down: set[str] = set()
        for deployment, urls in list(self._replicas.items()):
            results = await asyncio.gather(*(self._probe(u) for u in urls))
            if self._drains(deployment, results):
                down.add(deployment)
                await self._breaker.trip(deployment)
                if self._on_down is not None:
                    self._on_down(deployment)
        return frozenset(down)

    async def _check_and_log(self) -> None:
        down = await self.check()
        if down:
            log.warning("failing health, drained: %s", ", ".join(sorted(down)))

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()
