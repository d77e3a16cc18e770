"""How entries reach the ledger: through a Redis stream the sink drains into SQL, or straight
into SQL when Redis cannot take them. The ledger is idempotent by request id, so an entry that
travels both ways is still booked once.

Writing an entry is also the moment a request is complete, so the writer settles its budget
reservation (idempotent by request id) and adds the GPU-priced pools' tokens to their period's
counter (``gateway.accounting.gpu_rates``), reading the pools' published rates at most once per
``refresh_s``.

A settlement Redis cannot take (the entry went to SQL because Redis did not answer, or the
settlement itself failed) is kept and tried again before the next entry's, so a hard budget's
``spent`` still gets the real cost once Redis answers again, instead of only its reservation's
release at the sweep (``gateway.accounting.sweep``). At most ``max_pending`` are kept (the oldest
dropped, logged); a process that stops with some leaves them to the sweep's release."""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.budgets import BudgetBook
from gateway.accounting.events import encode_entry
from gateway.accounting.gpu_rates import GpuRates
from gateway.accounting.prices import PriceBook
from gateway.accounting.records import Ledger, LedgerEntry
from gateway.coalescer import Coalescer
from gateway.metrics import Metrics
from gateway.observability.tracing import Tracing

__all__ = ["LedgerWriter"]

log = logging.getLogger(__name__)


class LedgerWriter:
    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        ledger: Ledger,
        *,
        rates: GpuRates | None = None,
        prices: PriceBook | None = None,
        budgets: BudgetBook | None = None,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        coalescer: Coalescer | None = None,
        tracing: Tracing | None = None,
        max_pending: int = 10_000,
        metrics: Metrics | None = None,
    ) -> None:
        """``coalescer``: events go out in the same pipeline as other requests' bookkeeping;
        ``max_pending``: settlements kept for when Redis answers again; ``metrics``: where the
        booked entries' backend calls are counted (``tiergate_backend_attempts_total``)."""
        self._redis = redis
        self._coalescer = coalescer
        self._stream = stream
        self._ledger = ledger
        self._rates = rates
        self._prices = prices
        self._budgets = budgets
        self._refresh_s = refresh_s
        self._clock = clock
        self._refreshed_at: float | None = None
        self._tracing = tracing or Tracing.off()
        self._pending: OrderedDict[str, LedgerEntry] = OrderedDict()
        self._max_pending = max_pending
        self._metrics = metrics

    async def write(
        self,
        entry: LedgerEntry,
        *,
        then: Callable[[], None] | None = None,
        sql_fallback: bool = True,
    ) -> None:
        """Book ``entry``. ``then`` is called once the event is on its way, before its reply:
        on the coalescer, commands ``then`` queues go out behind the event in its pipeline
        (the worker acknowledges the job and sends its answer that way, in the same round trip;
        Redis runs them in order, so a job is never acknowledged before its event).
        ``sql_fallback=False``: a Redis failure is raised instead of writing to SQL (the worker
        tries again, so that its answer can still go out behind the event)."""

        async def write(e: LedgerEntry) -> str:
            return await self._write(e, then, sql_fallback)

        await self._tracing.ledger_write(entry, write)
        if self._metrics is not None:  # every call the row books, once, when it is booked
            self._metrics.observe_attempts((a.deployment, a.outcome) for a in entry.attempts)

    async def _write(
        self, entry: LedgerEntry, then: Callable[[], None] | None = None, sql_fallback: bool = True
    ) -> str:
        """Where the entry went: ``stream`` or ``sql``."""
        fields: dict[FieldT, EncodableT] = {"e": encode_entry(entry)}
        try:
            if self._coalescer is not None and not self._coalescer.closed:
                sent = self._coalescer.send(lambda pipe: pipe.xadd(self._stream, fields))
                if then is not None:
                    then()
                await sent
            else:
                await self._redis.xadd(self._stream, fields)
        except (RedisError, OSError) as exc:
            if not sql_fallback:
                raise
            log.warning("ledger stream unavailable (%s); writing to SQL", type(exc).__name__)
        else:
            await self._settle_budgets(entry)
            await self._meter_gpu_tokens(entry)
            return "stream"
        try:
            await self._ledger.record(entry)
        except (SQLAlchemyError, OSError):
            log.exception("ledger entry %s could not be written anywhere", entry.request_id)
            raise
        if self._budgets is not None and not entry.provisional:
            self._keep(entry)  # Redis just failed: settled with the next entry it takes
        return "sql"

    async def _settle_budgets(self, entry: LedgerEntry) -> None:
        """Settle the request's reservation, once per request id (``BudgetBook.settle``). A
        provisional entry (the edge's 504 for a started job) settles nothing: the run's entry
        that replaces its bookkeeping settles at the real cost; if none comes, the sweep
        releases the reservation at its bound (``gateway.accounting.sweep``), and a run's entry
        after that still adds its cost to ``spent``, once. Settling the provisional entry at $0
        would use up the request's one settlement and leave the real cost out of ``spent``."""
        if self._budgets is None or entry.provisional:
            return
        try:
            while self._pending:  # the ones Redis could not take before, oldest first
                _, pending = self._pending.popitem(last=False)
                try:
                    await self._budgets.settle(pending)
                except BaseException:
                    self._keep(pending, front=True)
                    raise
            await self._budgets.settle(entry)
        except (RedisError, OSError) as exc:
            self._keep(entry)
            log.warning(
                "budget of %s not settled (%s); %d kept to settle when Redis answers",
                entry.request_id, type(exc).__name__, len(self._pending),
            )  # fmt: skip

    def _keep(self, entry: LedgerEntry, *, front: bool = False) -> None:
        self._pending[entry.request_id] = entry
        if front:
            self._pending.move_to_end(entry.request_id, last=False)
        if len(self._pending) > self._max_pending:
            dropped, _ = self._pending.popitem(last=False)
            log.warning("budget settlement of %s dropped: left to the sweep's release", dropped)

    @property
    def pending_settlements(self) -> int:
        """Settlements kept for when Redis answers again."""
        return len(self._pending)

    async def _meter_gpu_tokens(self, entry: LedgerEntry) -> None:
        if self._rates is None or self._prices is None or not self._prices.gpu_models:
            return
        gpu = set(self._prices.gpu_models)
        tokens: Counter[str] = Counter()
        for attempt in entry.attempts:
            if attempt.deployment in gpu:
                tokens[attempt.deployment] += attempt.prompt_tokens + attempt.completion_tokens
        try:
            if tokens:
                await self._rates.record_tokens(tokens)
            await self.refresh_prices()
        except (RedisError, OSError) as exc:
            log.warning("GPU token counter unavailable (%s)", type(exc).__name__)

    async def refresh_prices(self, *, force: bool = False) -> None:
        """Read the GPU pools' rates of this period and the next into the price book
        (throttled; a period's rate never changes once published)."""
        if self._rates is None or self._prices is None:
            return
        now = self._clock()
        recent = self._refreshed_at is not None and now - self._refreshed_at < self._refresh_s
        if recent and not force:
            return
        self._refreshed_at = now
        await self._prices.ensure_rates()
