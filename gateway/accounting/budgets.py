"""Budgets: the worst-case cost of a request is reserved in Redis before it runs, and settled
with its real cost when its ledger entry is written.

A tenant's budgets (config ``tenants.<t>.budgets``, or a run-time tenant's profile) each cover
the tenant, or one app, or one tag, over a window (UTC month or N days). The book reads them at
every reservation and settlement (``TenantDirectory.budgets``), so a change applies to the next
request; a window's counter is named after its budget, so a new limit applies to what the
window has spent already. Per budget and window, a Redis hash holds ``spent`` and ``reserved``
micro-dollars. ``reserve`` runs one Lua script over every budget the request falls under: if any
*hard* budget would go over ``spent + reserved + worst case``, nothing is reserved and the
request is refused (429 ``budget_exceeded``); otherwise every budget's ``reserved`` grows by the
worst case, atomically, so concurrent requests cannot overshoot together. ``settle`` (one script,
once per request id) moves the reservation to ``spent`` at the real cost; a request whose price
is unknown is settled at its reservation.

Keys share the hash tag ``{budget:<tenant>}``: ``{prefix}:{budget:<t>}:b:<name>:<window start>``,
``…:res:<request id>`` (the reservation) and ``…:done:<request id>`` (settled marker).

Redis holds the fast copy; SQL is the truth. A window's hash is *seeded* from the ledger the
first time a reservation touches it (a new window, or after Redis lost its data): the reserve
script answers "unseeded", the book raises ``spent`` to what SQL has booked in that window (if
more), marks it seeded, and reserves again. Requests settled but not yet in SQL at that moment
(in flight while Redis was lost) are the only ones such a rebuild can miss.
"""

from __future__ import annotations

import calendar
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.prices import PriceBook
from gateway.accounting.records import LedgerEntry, to_micro
from gateway.errors import BudgetExceeded, ServiceUnavailable
from gateway.metrics import Metrics
from gateway.queue.jobs import Job
from gateway.settings import BudgetSettings

__all__ = ["BudgetBook", "BudgetStatus", "window_bounds", "worst_case_micro"]

log = logging.getLogger(__name__)


class SpentSource(Protocol):
    """Where a budget window's spending is rebuilt from (``SqlLedger.spent``)."""

    async def spent(
        self,
        tenant: str,
        start: datetime,
        end: datetime,
        *,
        app: str | None = None,
        tag: str | None = None,
    ) -> int: ...


PROMPT_ESTIMATE_MARGIN = 1.25
"""Prompt tokens are estimated before the call; reserve a quarter more."""
RESERVATION_TTL_S = 6 * 3600

_RESERVE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {1, ''} end
if ARGV[#ARGV] == '1' then
  for i = 2, #KEYS do
    if redis.call('HEXISTS', KEYS[i], 'seeded') == 0 then return {2, KEYS[i]} end
  end
end
local amount = tonumber(ARGV[1])
for i = 2, #KEYS do
  local limit = tonumber(ARGV[2 + (i - 2) * 3 + 1])
  local hard = ARGV[2 + (i - 2) * 3 + 2] == '1'
  if hard then
    local spent = tonumber(redis.call('HGET', KEYS[i], 'spent') or '0')
    local reserved = tonumber(redis.call('HGET', KEYS[i], 'reserved') or '0')
    if spent + reserved + amount > limit then return {0, KEYS[i]} end
  end
end
for i = 2, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'reserved', amount)
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[2 + (i - 2) * 3 + 3]))
  redis.call('HSET', KEYS[1], KEYS[i], amount)
end
if #KEYS > 1 then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2])) end
return {1, ''}
"""

_SEED = """
if redis.call('HSETNX', KEYS[1], 'seeded', '1') == 1 then
  local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
  if tonumber(ARGV[1]) > spent then redis.call('HSET', KEYS[1], 'spent', ARGV[1]) end
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 1
"""

_SETTLE = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[2])) then return {} end
local actual = tonumber(ARGV[1])
local out = {}
local held = redis.call('HGETALL', KEYS[1])
if #held > 0 then
  for i = 1, #held, 2 do
    local amount = tonumber(held[i + 1])
    local cost = actual
    if cost < 0 then cost = amount end
    redis.call('HINCRBY', held[i], 'reserved', -amount)
    local spent = redis.call('HINCRBY', held[i], 'spent', cost)
    table.insert(out, held[i]); table.insert(out, spent)
  end
  redis.call('DEL', KEYS[1])
elseif actual > 0 then
  for i = 3, #KEYS do
    local spent = redis.call('HINCRBY', KEYS[i], 'spent', actual)
    redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3]))
    table.insert(out, KEYS[i]); table.insert(out, spent)
  end
end
return out
"""


def window_bounds(window: str, at: datetime) -> tuple[datetime, datetime]:
    """The ``[start, end)`` of the window containing ``at`` (UTC)."""
    at = at.astimezone(UTC)
    if window == "month":
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        days = calendar.monthrange(at.year, at.month)[1]
        return start, start + timedelta(days=days)
    length = int(window.removesuffix("d"))
    epoch = date(1970, 1, 1)
    index = (at.date() - epoch).days // length
    start_day = epoch + timedelta(days=index * length)
    start = datetime(start_day.year, start_day.month, start_day.day, tzinfo=UTC)
    return start, start + timedelta(days=length)


def worst_case_micro(
    prices: PriceBook, deployments: Sequence[str], prompt_tokens: int, max_tokens: int
) -> int:
    """The most a request can cost: its estimated prompt (plus a margin) and ``max_tokens`` of
    output on the dearest deployment of its plan (a fallback may answer). Deployments with an
    unknown price add nothing (their rows are flagged and settled at the reservation)."""
    prompt = math.ceil(prompt_tokens * PROMPT_ESTIMATE_MARGIN) + 16
    worst = Decimal(0)
    for model in deployments:
        price = prices.price_of(model)
        if price is not None:
            worst = max(worst, price.input_per_token * prompt + price.output_per_token * max_tokens)
    return to_micro(worst)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    name: str
    limit_micro_usd: int
    spent_micro_usd: int
    reserved_micro_usd: int
    window_start: datetime
    window_end: datetime
    mode: str
    app: str | None
    tag: str | None

    @property
    def ratio(self) -> float:
        return self.spent_micro_usd / self.limit_micro_usd


class BudgetBook:
    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        budgets: Mapping[str, Sequence[BudgetSettings]],
        *,
        prices: PriceBook,
        metrics: Metrics | None = None,
        ledger: SpentSource | None = None,
    ) -> None:
        """``budgets``: each tenant's, read at every use (a live view such as
        ``TenantDirectory.budgets``); ``ledger``: seeds each budget window from SQL (none:
        windows start at zero)."""
        self._redis = redis
        self._ledger = ledger
        self._prices = prices
        self._prefix = prefix
        self._budgets = budgets
        self._metrics = metrics
        self._reserve = redis.register_script(_RESERVE)
        self._seed_script = redis.register_script(_SEED)
        self._settle = redis.register_script(_SETTLE)

    def budgets(self, tenant: str) -> tuple[BudgetSettings, ...]:
        return tuple(self._budgets.get(tenant, ()))

    def _tag(self, tenant: str) -> str:
        return f"{self._prefix}:{{budget:{tenant}}}"

    def _key(self, tenant: str, budget: BudgetSettings, at: datetime) -> str:
        start, _end = window_bounds(budget.window, at)
        return f"{self._tag(tenant)}:b:{budget.name}:{start.date().isoformat()}"

    def _applicable(
        self, tenant: str, app: str | None, tags: Sequence[str]
    ) -> list[BudgetSettings]:
        return [
            b
            for b in self.budgets(tenant)
            if (b.app is None or b.app == app) and (b.tag is None or b.tag in tags)
        ]

    @staticmethod
    def _ttl(budget: BudgetSettings, at: datetime) -> int:
        _start, end = window_bounds(budget.window, at)
        return int((end - at).total_seconds()) + 40 * 86400

    async def reserve(
        self,
        *,
        tenant: str,
        request_id: str,
        app: str | None,
        tags: Sequence[str],
        amount_micro_usd: int,
        at: datetime | None = None,
    ) -> None:
        """Reserve ``amount`` on every budget the request falls under, or raise
        ``BudgetExceeded`` (nothing reserved) when a hard one cannot cover it."""
        budgets = self._applicable(tenant, app, tags)
        if not budgets:
            return
        at = at or datetime.now(UTC)
        keys = [f"{self._tag(tenant)}:res:{request_id}"]
        args: list[int | str] = [amount_micro_usd, RESERVATION_TTL_S]
        for b in budgets:
            keys.append(self._key(tenant, b, at))
            args += [to_micro(b.limit_usd), "1" if b.mode == "hard" else "0", self._ttl(b, at)]
        args.append("1" if self._ledger is not None else "0")
        try:
            for _ in range(len(budgets) + 1):
                ok, key = await self._reserve(keys=keys, args=args)
                if int(ok) != 2:
                    break
                budget = next(b for b in budgets if self._key(tenant, b, at) == _text(key))
                await self._seed(tenant, budget, at)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"budgets unavailable: {type(exc).__name__}") from exc
        except SQLAlchemyError as exc:
            raise ServiceUnavailable(f"budgets unavailable: {type(exc).__name__}") from exc
        if not int(ok):
            name = next(b.name for b in budgets if self._key(tenant, b, at) == _text(key))
            if self._metrics is not None:
                self._metrics.budget_refusals.labels(tenant, name).inc()
            raise BudgetExceeded(
                f"budget {name!r} of tenant {tenant!r} cannot cover this request "
                f"(up to ${Decimal(amount_micro_usd).scaleb(-6)})"
            )

    async def _seed(self, tenant: str, budget: BudgetSettings, at: datetime) -> None:
        """Raise the window's ``spent`` to what SQL booked in it, once (the ``seeded`` flag is
        set in the same script; a process that lost the race changes nothing)."""
        assert self._ledger is not None
        start, end = window_bounds(budget.window, at)
        booked = await self._ledger.spent(tenant, start, end, app=budget.app, tag=budget.tag)
        key = self._key(tenant, budget, at)
        await self._seed_script(keys=[key], args=[booked, self._ttl(budget, at)])
        log.info("budget %s of %s seeded from the ledger: %d uUSD", budget.name, tenant, booked)

    async def reserve_job(self, job: Job, prompt_tokens: int, max_tokens: int) -> None:
        """Reserve the worst case of ``job`` (its plan, estimated prompt, ``max_tokens``)."""
        if not self.budgets(job.tenant):
            return
        await self.reserve(
            tenant=job.tenant,
            request_id=job.request_id,
            app=job.app,
            tags=job.tags,
            amount_micro_usd=worst_case_micro(
                self._prices, job.plan.deployments, prompt_tokens, max_tokens
            ),
            at=datetime.fromtimestamp(job.received_at, UTC),
        )

    async def settle(self, entry: LedgerEntry) -> None:
        """Turn the request's reservation into its real cost (once per request id)."""
        budgets = self._applicable(entry.tenant, entry.app, entry.tags)
        if not budgets:
            return
        tag = self._tag(entry.tenant)
        keys = [f"{tag}:res:{entry.request_id}", f"{tag}:done:{entry.request_id}"]
        keys += [self._key(entry.tenant, b, entry.created_at) for b in budgets]
        actual = -1 if entry.cost_micro_usd is None else entry.cost_micro_usd
        ttl = max(self._ttl(b, entry.created_at) for b in budgets)
        result = await self._settle(keys=keys, args=[actual, RESERVATION_TTL_S * 4, ttl])
        spent = {_text(result[i]): int(result[i + 1]) for i in range(0, len(result), 2)}
        self._observe(entry.tenant, budgets, entry.created_at, spent)

    def _observe(
        self,
        tenant: str,
        budgets: Sequence[BudgetSettings],
        at: datetime,
        spent: Mapping[str, int],
    ) -> None:
        if self._metrics is None:
            return
        for b in budgets:
            value = spent.get(self._key(tenant, b, at))
            if value is None:
                continue
            ratio = value / to_micro(b.limit_usd)
            self._metrics.budget_spent_ratio.labels(tenant, b.name).set(ratio)
            for threshold in b.alert_at:
                self._metrics.budget_alert.labels(tenant, b.name, f"{threshold:g}").set(
                    1.0 if ratio >= threshold else 0.0
                )

    async def status(self, tenant: str, at: datetime | None = None) -> list[BudgetStatus]:
        at = at or datetime.now(UTC)
        budgets = self.budgets(tenant)
        if not budgets:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for b in budgets:
                pipe.hmget(self._key(tenant, b, at), ["spent", "reserved"])
            values = await pipe.execute()
        out = []
        for b, (spent, reserved) in zip(budgets, values, strict=True):
            start, end = window_bounds(b.window, at)
            out.append(
                BudgetStatus(
                    name=b.name,
                    limit_micro_usd=to_micro(b.limit_usd),
                    spent_micro_usd=int(spent or 0),
                    reserved_micro_usd=int(reserved or 0),
                    window_start=start,
                    window_end=end,
                    mode=b.mode,
                    app=b.app,
                    tag=b.tag,
                )
            )
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
