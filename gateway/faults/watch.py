"""A cached view of which breakers are open, refreshed in the background.

The router's ``Signals`` are a snapshot taken without I/O per request, so the edge reads
``BreakerWatch.open_now`` (a frozenset) and this task refreshes it from Redis every
``interval_s`` (one round trip for all deployments, ``RedisBreaker.refresh``, which also renews
the breaker's local view of closed breakers: by default ``interval_s`` is half of
``closed_view_s``, so calls find it fresh); it also re-exports every deployment's state to
``/metrics``, so the gauge shows what all processes did, not only this one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from gateway.faults.breaker import BreakerState, RedisBreaker
from gateway.loops import Loop

__all__ = ["BreakerWatch"]

log = logging.getLogger(__name__)


class BreakerWatch:
    def __init__(
        self,
        breaker: RedisBreaker,
        deployments: Sequence[str],
        *,
        interval_s: float | None = None,
        set_state: Callable[[str, str], None] | None = None,
    ) -> None:
        self._breaker = breaker
        self._deployments = tuple(deployments)
        view_s = breaker.config.closed_view_s
        if interval_s is None:
            interval_s = min(1.0, view_s / 2) if view_s > 0 else 1.0
        self._set_state = set_state
        self._loop = Loop(  # a background refresher must not die
            "breaker-watch",
            self.refresh,
            every_s=interval_s,
            catch=(Exception,),
            on_error=lambda exc: log.error("breaker refresh failed", exc_info=exc),
        )
        self.open_now: frozenset[str] = frozenset()
        """Deployments whose breaker was open at the last refresh."""

    async def refresh(self) -> None:
        try:
            states = await self._breaker.refresh(self._deployments)
        except RedisError:
            return  # keep the last view; the breaker itself fails open
        self.open_now = frozenset(n for n, s in states.items() if s is BreakerState.OPEN)
        if self._set_state is not None:
            for name, state in states.items():
                self._set_state(name, state.name.lower())

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()
