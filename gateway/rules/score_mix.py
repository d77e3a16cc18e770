"""Each tenant's recent classifier scores, as quantile tables for ``target_large_share``.

A rule's ``target_large_share`` means a share of *the tenant's own* traffic
(docs/rules.md#target-large-share). Every ``refresh_s`` this task reads, per tenant, the scores
of its newest ``max_scores`` classifier-scored requests of the last ``window_days`` from the
ledger and keeps a 101-point quantile table (``router.share.ScoreQuantiles``); the edge hands
the request's tenant's table to the pure planner in ``Signals.own_scores``.

One query per tenant, ``WHERE tenant = ? AND created_at >= ? AND score IS NOT NULL ORDER BY
created_at DESC LIMIT ?``: it walks the ``(tenant, created_at)`` index backwards from the newest
row and stops after ``max_scores`` scored rows, on SQLite and PostgreSQL alike. A failed read
keeps the last tables (the planner falls back to the documented mix only for tenants with too
few scores).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.accounting.schema import ledger_entries
from gateway.loops import Loop
from gateway.settings import OwnShareSettings
from router.share import ScoreQuantiles, quantile_table

__all__ = ["ScoreMix"]

log = logging.getLogger(__name__)


class ScoreMix:
    def __init__(
        self,
        engine: AsyncEngine,
        tenants: Callable[[], Iterable[str]],
        settings: OwnShareSettings | None = None,
    ) -> None:
        self._engine = engine
        self._tenants = tenants
        self.settings = settings or OwnShareSettings()
        self._tables: Mapping[str, ScoreQuantiles] = MappingProxyType({})
        self._loop = Loop(  # a background refresher must not die
            "score-mix",
            self.refresh,
            every_s=lambda: self.settings.refresh_s,
            catch=(Exception,),
            on_error=_refresh_failed,
        )

    def of(self, tenant: str) -> ScoreQuantiles | None:
        """``tenant``'s table at the last refresh; ``None``: no scored request in the window."""
        return self._tables.get(tenant)

    async def refresh(self, now: datetime | None = None) -> None:
        """Re-read every tenant's recent scores (``now``: the window's end, default the clock)."""
        since = (now or datetime.now(UTC)) - timedelta(days=self.settings.window_days)
        c = ledger_entries.c
        tables: dict[str, ScoreQuantiles] = {}
        async with self._engine.connect() as conn:
            for tenant in sorted(set(self._tenants())):
                query = (
                    select(c.score)
                    .where(c.tenant == tenant, c.created_at >= since, c.score.is_not(None))
                    .order_by(c.created_at.desc())
                    .limit(self.settings.max_scores)
                )
                scores = [float(s) for s in (await conn.scalars(query))]
                if scores:
                    tables[tenant] = ScoreQuantiles(
                        quantile_table(scores), len(scores), self.settings.window_days
                    )
        self._tables = MappingProxyType(tables)

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()


def _refresh_failed(exc: BaseException) -> None:
    if isinstance(exc, SQLAlchemyError):
        log.warning("tenant score tables not refreshed", exc_info=exc)
    else:
        log.error("tenant score tables: refresh failed", exc_info=exc)
