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
``…:res:<request id>`` (the reservation: window key → amount), ``…:open`` (a sorted set of the
request ids holding a reservation, scored by when it is to be released, ms on Redis's clock) and
``…:done:<request id>`` (settled marker). A reservation and the open set live as long as the
reservation's windows, so a reservation cannot expire before it is settled or released.

A reservation that is never settled (its process died between reserving and queueing, or a path
that books nothing, such as an idempotent repeat) is *released*: the reserve script records its
due time, ``release_after_s`` after it was made (``release_bound_s``: the longest a request may
live, ``queue.max_timeout_ms``, plus ``RELEASE_MARGIN_S`` for what may still come after its
deadline), and ``release_unsettled`` (one script per tenant, run by ``gateway.accounting.sweep``
in every process) takes the amounts of the due ones back out of ``reserved``. The reservation
stays, marked released, for as long as the settled marker: a settlement that comes later still
books its real cost into ``spent`` (or the reservation, when the price is unknown) and takes
nothing out of ``reserved`` again. Both scripts delete what they handled from the open set, so
whichever runs first wins and the other changes nothing; several sweepers at once release once.
The release and settle scripts reach the reservation's windows (and the release script the
reservations) through names they read, not declared keys; all are in the tenant's slot. The
scripts themselves are in ``gateway.accounting.budget_scripts``.

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
from decimal import ROUND_CEILING, Decimal
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.budget_alerts import BudgetAlerts
from gateway.accounting.budget_scripts import (
    RELEASE_SCRIPT,
    RESERVE_SCRIPT,
    SEED_SCRIPT,
    SETTLE_SCRIPT,
)
from gateway.accounting.prices import PriceBook
from gateway.accounting.records import LedgerEntry, to_micro
from gateway.errors import BudgetBusy, BudgetExceeded, ServiceUnavailable
from gateway.metrics import Metrics
from gateway.queue.keys import RedisKeys
from gateway.settings import BudgetSettings, QueueSettings
from router.plan import RoutePlan

__all__ = [
    "BudgetBook",
    "BudgetStatus",
    "BudgetedRequest",
    "Released",
    "release_bound_s",
    "window_bounds",
    "worst_case_micro",
]

log = logging.getLogger(__name__)


class BudgetedRequest(Protocol):
    """What a reservation reads of a queued request (``gateway.queue.jobs.Job``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def app(self) -> str | None: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def received_at(self) -> float: ...
    @property
    def plan(self) -> RoutePlan: ...


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


RESERVATION_TTL_S = 6 * 3600
"""A settled marker lives four times this (a replayed settlement changes nothing meanwhile); so
does a released reservation (a settlement that comes after its release books it once)."""
RELEASE_MARGIN_S = 300
"""How long after its deadline a request may still settle: a worker's graceful drain (10 s), a
dead worker's job reclaimed (idle 15 s, its heartbeat gone after 6 s, looked for every 7.5 s)
and booked at once as past its deadline, the edge's wait for a started job (5 s), the ledger
write and the settlement (a few Redis round trips, 1 s timeouts). About a minute; five here."""
BUSY_RETRY_AFTER_S = 1.0
"""``Retry-After`` of a refusal only in-flight reservations caused: they settle in seconds."""
RELEASE_BATCH = 500
"""Most reservations one release script handles (it runs again while it finds this many)."""


def release_bound_s(max_timeout_ms: int) -> float:
    """How long after it was made an unsettled reservation is released: no request lives past
    ``queue.max_timeout_ms``, and ``RELEASE_MARGIN_S`` covers what may follow its deadline."""
    return max_timeout_ms / 1000 + RELEASE_MARGIN_S


DEFAULT_RELEASE_AFTER_S = release_bound_s(QueueSettings().max_timeout_ms)


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
    prices: PriceBook,
    deployments: Sequence[str],
    prompt_tokens: int,
    max_tokens: int | None,
    *,
    at: float | None = None,
    choices: int = 1,
) -> int:
    """The most a request can cost: ``prompt_tokens`` (an upper bound:
    ``gateway.accounting.bounds.prompt_token_bound``) and its output limit on the dearest
    deployment of its plan (a fallback may answer). The output limit is ``max_tokens`` (the
    client's, or a rule's cap), never more than the deployment's context (``max_model_len``),
    which is also the limit without one; ``choices`` (``n``) answers of it each, the prompt
    billed once. Priced at what settlement will use: the price of the
    request's pricing period (``at``: when it was received). Rounded up, so a reservation is
    never a fraction of a micro-dollar short. Deployments with an unknown price add nothing
    (their rows are flagged and settled at the reservation)."""
    worst = Decimal(0)
    for model in deployments:
        price = prices.price_of(model, at=at)
        if price is not None:
            limit = prices.output_limit(model)
            output = limit if max_tokens is None else min(max_tokens, limit)
            output_cost = price.output_per_token * output * choices
            worst = max(worst, price.input_per_token * prompt_tokens + output_cost)
    return to_micro(worst, rounding=ROUND_CEILING)


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


@dataclass(frozen=True, slots=True)
class Released:
    """What one ``release_unsettled`` took back for a tenant."""

    tenant: str
    reservations: int
    micro_usd: int
    """The sum of the released reservations (each one counted once, whatever its windows)."""


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
        release_after_s: float = DEFAULT_RELEASE_AFTER_S,
        alerts: BudgetAlerts | None = None,
    ) -> None:
        """``budgets``: each tenant's, read at every use (a live view such as
        ``TenantDirectory.budgets``); ``ledger``: seeds each budget window from SQL (none:
        windows start at zero); ``release_after_s``: when a reservation no settlement came for
        is released (``release_bound_s`` of the queue's longest timeout); ``alerts``: where a
        settlement that reaches an ``alert_at`` threshold is sent (``BudgetAlerts``)."""
        self._redis = redis
        self._ledger = ledger
        self._prices = prices
        self._prefix = prefix
        self._keys = RedisKeys(prefix)
        self._budgets = budgets
        self._metrics = metrics
        self._reserve = redis.register_script(RESERVE_SCRIPT)
        self._seed_script = redis.register_script(SEED_SCRIPT)
        self._settle = redis.register_script(SETTLE_SCRIPT)
        self._release = redis.register_script(RELEASE_SCRIPT)
        self._release_after_ms = max(math.ceil(release_after_s * 1000), 0)
        self._alerts = alerts

    def budgets(self, tenant: str) -> tuple[BudgetSettings, ...]:
        return tuple(self._budgets.get(tenant, ()))

    def _open(self, tenant: str) -> str:
        return self._keys.budget_open(tenant)

    @property
    def sweep_key(self) -> str:
        """Whose turn it is to sweep (``gateway.accounting.sweep``); no tenant's slot."""
        return self._keys.budget_sweep

    def _key(self, tenant: str, budget: BudgetSettings, at: datetime) -> str:
        start, _end = window_bounds(budget.window, at)
        return self._keys.budget_window(tenant, budget.name, start.date().isoformat())

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
        keys = [self._keys.budget_reservation(tenant, request_id), self._open(tenant)]
        seeded = "1" if self._ledger is not None else "0"
        args: list[int | str] = [amount_micro_usd, request_id, self._release_after_ms, seeded]
        for b in budgets:
            keys.append(self._key(tenant, b, at))
            args += [to_micro(b.limit_usd), "1" if b.mode == "hard" else "0", self._ttl(b, at)]
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
        if int(ok) in (0, 3):
            name = next(b.name for b in budgets if self._key(tenant, b, at) == _text(key))
            if self._metrics is not None:
                self._metrics.budget_refusals.labels(tenant, name).inc()
            worst = Decimal(amount_micro_usd).scaleb(-6)
            if int(ok) == 3:
                raise BudgetBusy(
                    f"budget {name!r} of tenant {tenant!r} is held by requests in flight; "
                    f"this one (up to ${worst}) fits once they settle",
                    retry_after=BUSY_RETRY_AFTER_S,
                )
            raise BudgetExceeded(
                f"budget {name!r} of tenant {tenant!r} cannot cover this request (up to ${worst})"
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

    async def reserve_job(
        self, job: BudgetedRequest, prompt_tokens: int, max_tokens: int | None, *, choices: int = 1
    ) -> None:
        """Reserve the worst case of ``job``: ``prompt_tokens`` (an upper bound,
        ``prompt_token_bound``) and ``max_tokens`` of output (``None``: the client set none;
        a rule's cap applies either way) on its plan's dearest deployment, at the price of its
        pricing period (``PriceBook.ensure_rates``)."""
        if not self.budgets(job.tenant):
            return
        caps = [m for m in (max_tokens, job.plan.max_tokens) if m is not None]
        try:
            await self._prices.ensure_rates(job.received_at)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"budgets unavailable: {type(exc).__name__}") from exc
        await self.reserve(
            tenant=job.tenant,
            request_id=job.request_id,
            app=job.app,
            tags=job.tags,
            amount_micro_usd=worst_case_micro(
                self._prices,
                job.plan.deployments,
                prompt_tokens,
                min(caps) if caps else None,
                at=job.received_at,
                choices=choices,
            ),
            at=datetime.fromtimestamp(job.received_at, UTC),
        )

    async def settle(self, entry: LedgerEntry) -> None:
        """Turn the request's reservation into its real cost (once per request id)."""
        nano = entry.cost_nano  # rounded up: a budget's spend is never below the rows'
        actual = -1 if nano is None else -(-nano // 1000)
        await self._settle_request(
            entry.tenant, entry.request_id, entry.app, entry.tags, entry.created_at, actual
        )

    async def settle_unbooked(self, job: BudgetedRequest) -> None:
        """Settle ``job``'s reservation at no cost: a repeat answered with its first request's
        reply (idempotency), which runs nothing and has no ledger row of its own."""
        at = datetime.fromtimestamp(job.received_at, UTC)
        await self._settle_request(job.tenant, job.request_id, job.app, job.tags, at, 0)

    async def _settle_request(
        self,
        tenant: str,
        request_id: str,
        app: str | None,
        tags: Sequence[str],
        at: datetime,
        actual: int,
    ) -> None:
        budgets = self._applicable(tenant, app, tags)
        if not budgets:
            return
        k = self._keys
        keys = [
            k.budget_reservation(tenant, request_id),
            k.budget_settled(tenant, request_id),
            self._open(tenant),
        ]
        keys += [self._key(tenant, b, at) for b in budgets]
        ttl = max(self._ttl(b, at) for b in budgets)
        args: list[int | str] = [actual, RESERVATION_TTL_S * 4, ttl, request_id]
        result = await self._settle(keys=keys, args=args)
        spent = {_text(result[i]): int(result[i + 1]) for i in range(0, len(result), 2)}
        self._observe(tenant, budgets, at, spent)

    async def release_unsettled(self, tenant: str) -> Released:
        """Take the reservations of ``tenant`` that are due (made ``release_after_s`` ago and
        never settled) back out of their windows' ``reserved``: atomically, once each, safe
        with other sweepers and settlements at the same time. Redis errors propagate."""
        args: list[int | str] = [
            self._keys.budget_reservation(tenant, ""),
            RELEASE_BATCH,
            RESERVATION_TTL_S * 4,
        ]
        count = total = 0
        while True:
            released, amount, due = await self._release(keys=[self._open(tenant)], args=args)
            count, total = count + int(released), total + int(amount)
            if int(due) < RELEASE_BATCH:
                break
        if count:
            if self._metrics is not None:
                self._metrics.budget_released.labels(tenant).inc(count)
            log.warning(
                "released %d budget reservation(s) of tenant %s never settled: "
                "$%s back out of reserved",
                count,
                tenant,
                Decimal(total).scaleb(-6),
            )
        return Released(tenant, count, total)

    async def sweep(self) -> list[Released]:
        """``release_unsettled`` for every tenant (those with budgets or without: a budget
        removed while its reservations were open leaves them to release too)."""
        out = []
        for tenant in list(self._budgets):
            released = await self.release_unsettled(tenant)
            if released.reservations:
                out.append(released)
        return out

    def _observe(
        self,
        tenant: str,
        budgets: Sequence[BudgetSettings],
        at: datetime,
        spent: Mapping[str, int],
    ) -> None:
        for b in budgets:
            value = spent.get(self._key(tenant, b, at))
            if value is None:
                continue
            if self._alerts is not None:
                start, _end = window_bounds(b.window, at)
                self._alerts.observe(tenant, b, start, value, to_micro(b.limit_usd))
            if self._metrics is None:
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
