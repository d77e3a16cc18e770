"""Budget alerts that reach someone: a webhook per budget, once per threshold crossed per window.

When a settlement brings a budget window's spend to one of its ``alert_at`` fractions of the
limit, the book calls ``BudgetAlerts.observe``. The first process to insert the row
``(tenant, budget, window start, threshold)`` into ``budget_alerts`` (SQL, primary key: a
crossing is claimed once, across processes and restarts) POSTs the alert to the URL in the
budget's ``webhook_url_env`` environment variable, as Slack-compatible JSON (``text``, with the
figures as fields beside it), retried with backoff (tenacity) on a connection error or a status
other than 2xx, and records how it went (``sent``, ``failed`` with the last error, or ``no
webhook``) and after how many attempts. Sending runs in the background: a settlement never
waits for a webhook.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import aiohttp
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from gateway.accounting.schema import budget_alerts
from gateway.settings import BudgetSettings

__all__ = ["BudgetAlerts", "WebhookRefused"]

log = logging.getLogger(__name__)


class WebhookRefused(Exception):
    """The webhook answered something else than 2xx."""


class BudgetAlerts:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        attempts: int = 5,
        wait_s: float = 1.0,
        timeout_s: float = 10.0,
        environ: Callable[[str], str | None] = os.environ.get,
    ) -> None:
        self._engine = engine
        self._attempts = attempts
        self._wait_s = wait_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._environ = environ
        self._claimed: set[tuple[str, str, datetime, float]] = set()
        self._tasks: set[asyncio.Task[str | None]] = set()
        self._session: aiohttp.ClientSession | None = None

    def observe(
        self,
        tenant: str,
        budget: BudgetSettings,
        window_start: datetime,
        spent_micro_usd: int,
        limit_micro_usd: int,
    ) -> None:
        """The window's spend now: fire each threshold it reached that this process has not
        seen fired (the SQL row decides across processes)."""
        for threshold in budget.alert_at:
            key = (tenant, budget.name, window_start, threshold)
            if spent_micro_usd < threshold * limit_micro_usd or key in self._claimed:
                continue
            self._claimed.add(key)
            task = asyncio.create_task(
                self.fire(tenant, budget, window_start, threshold, spent_micro_usd, limit_micro_usd)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def fire(
        self,
        tenant: str,
        budget: BudgetSettings,
        window_start: datetime,
        threshold: float,
        spent_micro_usd: int,
        limit_micro_usd: int,
    ) -> str | None:
        """Claim the crossing and send it; its recorded status (``None``: claimed before)."""
        url = self._environ(budget.webhook_url_env) if budget.webhook_url_env else None
        row = {
            "tenant": tenant,
            "budget": budget.name,
            "window_start": window_start,
            "threshold": threshold,
            "spent_micro_usd": spent_micro_usd,
            "limit_micro_usd": limit_micro_usd,
            "fired_at": datetime.now(UTC),
            "status": "sending" if url else "no webhook",
            "attempts": 0,
        }
        try:
            async with self._engine.begin() as conn:
                await conn.execute(insert(budget_alerts), row)
        except IntegrityError:
            return None  # another process (or an earlier run) has this crossing
        except SQLAlchemyError as exc:
            log.warning("budget alert of %s/%s not recorded: %s", tenant, budget.name, exc)
            return None
        spent = Decimal(spent_micro_usd).scaleb(-6)
        limit = Decimal(limit_micro_usd).scaleb(-6)
        log.warning(
            "budget %s of tenant %s reached %g of its limit: $%s of $%s",
            budget.name, tenant, threshold, spent, limit,
        )  # fmt: skip
        if not url:
            return "no webhook"
        payload = {
            "text": (
                f":warning: tiergate budget *{budget.name}* of tenant *{tenant}* reached "
                f"{threshold:.0%} of its limit: ${spent} of ${limit} "
                f"({budget.window} window from {window_start.date().isoformat()}, "
                f"{budget.mode})"
            ),
            "tenant": tenant,
            "budget": budget.name,
            "threshold": threshold,
            "spent_usd": str(spent),
            "limit_usd": str(limit),
            "window_start": window_start.isoformat(),
            "mode": budget.mode,
        }
        attempts, status, error = await self._send(url, payload)
        try:
            async with self._engine.begin() as conn:
                await conn.execute(
                    update(budget_alerts)
                    .where(
                        budget_alerts.c.tenant == tenant,
                        budget_alerts.c.budget == budget.name,
                        budget_alerts.c.window_start == window_start,
                        budget_alerts.c.threshold == threshold,
                    )
                    .values(status=status, attempts=attempts, error=error)
                )
        except SQLAlchemyError as exc:
            log.warning("budget alert status not recorded: %s", exc)
        return status

    async def _send(self, url: str, payload: dict[str, object]) -> tuple[int, str, str | None]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        session = self._session
        attempts = 0

        async def post() -> None:
            nonlocal attempts
            attempts += 1
            async with session.post(url, json=payload) as resp:
                if not 200 <= resp.status < 300:
                    raise WebhookRefused(f"HTTP {resp.status}")

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self._attempts),
                wait=wait_exponential(multiplier=self._wait_s, max=60),
                retry=retry_if_exception_type((WebhookRefused, aiohttp.ClientError, TimeoutError)),
            ):
                with attempt:
                    await post()
        except RetryError as exc:
            error = exc.last_attempt.exception()
            log.error("budget alert webhook failed after %d attempts: %s", attempts, error)
            return attempts, "failed", str(error)[:500]
        return attempts, "sent", None

    async def drain(self) -> None:
        """Wait for the alerts being sent (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
