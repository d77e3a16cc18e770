"""The periodic release of budget reservations that were never settled.

Every process runs one ``ReservationSweep`` (``open_services``: edges alone, workers, the sink,
or all in one), so whatever the layout, some process sweeps. Each tick it asks for the turn
(``SET NX`` on ``BudgetBook.sweep_key``, held for most of an interval): the process that gets
it runs ``BudgetBook.sweep``, the others skip, so N processes cost one sweep per interval plus
N cheap ``SET``s. The turn is only economy: the release scripts are atomic and release each
reservation once, so sweeps that overlap (a slow one, a clock jump) are harmless.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.accounting.budgets import BudgetBook
from gateway.loops import Loop

__all__ = ["SWEEP_INTERVAL_S", "ReservationSweep"]

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 60.0
"""How often some process sweeps: a due reservation is released within about one of these."""


class ReservationSweep:
    def __init__(
        self,
        redis: aioredis.Redis,
        book: BudgetBook,
        *,
        owner: str,
        interval_s: float = SWEEP_INTERVAL_S,
    ) -> None:
        """``owner``: this process, as named in the turn key (for whoever reads Redis)."""
        self._redis = redis
        self._book = book
        self._owner = owner
        self._interval_s = interval_s
        self._loop = Loop(  # at once on start: a restart after a crash releases what is due
            "tiergate-budget-sweep",
            self.run_once,
            every_s=interval_s,
            catch=(RedisError, OSError),
            on_error=lambda exc: log.warning(
                "budget reservations not swept: %s", type(exc).__name__
            ),
        )

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()

    async def run_once(self) -> bool:
        """Sweep if it is this process's turn; whether it was. Redis errors propagate."""
        turn_ms = max(int(self._interval_s * 900), 1)  # over before our own next tick
        if not await self._redis.set(self._book.sweep_key, self._owner, nx=True, px=turn_ms):
            return False
        await self._book.sweep()
        return True
