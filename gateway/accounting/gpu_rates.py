"""GPU-priced pools: a per-token rate fixed for each pricing period, published a period ahead.

A self-hosted pool (``gpu_hourly_usd``) costs what its replicas cost while they run, busy or
idle. Finance needs a rate it can plan with, and a budget needs a rate that settlement cannot
exceed, so the rate is not a rolling measurement: each pricing period (``gpu_rate_period_s``,
a UTC day by default) has one rate, the same for every request received in it, input and output
tokens alike. The rate of period P is

    the pool's cost over period P-2 ÷ the tokens it served in P-2        (basis ``measured``)

bounded to ``[gpu_rate_min_per_mtok, gpu_rate_max_per_mtok]`` (basis ``measured, capped`` when a
bound applied). P-2 is complete before P-1 starts, so the rate of P is computed and published
(Redis, ``SET NX``: every process prices with the same one) during P-1: a period ahead. A
window with no tokens, or with no record of a replica running, gives the *planned* rate: the
pool's configured $/h ÷ (3600 x ``gpu_expected_tokens_per_s``) (basis ``planned``), else the
deployment's explicit ``price`` (basis ``settings``), else the price is unknown (rows flagged).

The pool's cost is the gateway's own record of its replicas running: every process checks each
GPU pool's replicas (``GET /health``) every ``sample_s`` seconds; a replica that answers 200 is
counted as running for that ``bucket_s``-second bucket, once whichever processes saw it
(``SADD`` per bucket), adding ``bucket_s`` replica-seconds to the period's and the UTC day's
counters. Pool cost = replica-seconds x ``gpu_hourly_usd`` x ``gpus_per_replica`` / 3600. The
daily true-up (``gateway.accounting.rollups``) charges each day's recorded replica time in full,
by each tenant's share of the tokens.

Keys (one deployment's share a hash tag): ``{prefix}:{gpu:<d>}:ptok:<period>`` (tokens),
``…:rs:<period>`` and ``…:rsday:<YYYY-MM-DD>`` (replica-seconds), ``…:up:<bucket>`` (replicas
seen in a bucket), ``…:rate:<period>`` (the published rate, JSON).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.faults.health import health_url
from gateway.loops import Loop
from gateway.queue.keys import RedisKeys

__all__ = ["GpuPool", "GpuRate", "GpuRates", "ReplicaClock"]

log = logging.getLogger(__name__)

_PER_MTOK = Decimal(1_000_000)
_RATE_KEEP_PERIODS = 64
"""How many periods a published rate (and a period's counters) stays in Redis."""


@dataclass(frozen=True, slots=True)
class GpuPool:
    """What prices one GPU pool: its cost per replica-hour and its rate settings."""

    deployment: str
    replica_hourly_usd: Decimal
    """``gpu_hourly_usd x gpus_per_replica``."""
    replicas: int
    """Configured replicas (used only for the planned rate)."""
    period_s: int = 86_400
    expected_tokens_per_s: float | None = None
    min_per_token: Decimal | None = None
    max_per_token: Decimal | None = None
    fallback_input: Decimal | None = None
    fallback_output: Decimal | None = None
    """The deployment's explicit price per token, if any."""

    def period(self, at: float) -> int:
        return math.floor(at / self.period_s)

    def period_bounds(self, period: int) -> tuple[datetime, datetime]:
        return (
            datetime.fromtimestamp(period * self.period_s, UTC),
            datetime.fromtimestamp((period + 1) * self.period_s, UTC),
        )

    @property
    def planned_per_token(self) -> Decimal | None:
        if self.expected_tokens_per_s is None:
            return None
        hourly = self.replica_hourly_usd * self.replicas
        return hourly / (Decimal(3600) * Decimal(repr(self.expected_tokens_per_s)))


@dataclass(frozen=True, slots=True)
class GpuRate:
    """The rate of one pool for one period, and what it was computed from."""

    deployment: str
    period: int
    period_start: datetime
    period_end: datetime
    basis: str
    """``measured``, ``measured, capped at max`` / ``… raised to min``, ``planned``, ``settings``
    or ``unknown``."""
    input_per_token: Decimal | None
    output_per_token: Decimal | None
    window_start: datetime
    window_end: datetime
    window_tokens: int
    window_replica_s: int
    window_pool_usd: Decimal

    @property
    def id(self) -> str:
        return f"{self.deployment}@{self.period_start.strftime('%Y-%m-%dT%H:%MZ')}"

    @property
    def source(self) -> str:
        """How a ledger row names it: the rate id, its basis and the window it came from."""
        return (
            f"gpu-rate {self.id} ({self.basis}; window "
            f"{self.window_start.strftime('%Y-%m-%dT%H:%MZ')}/"
            f"{self.window_end.strftime('%Y-%m-%dT%H:%MZ')})"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "deployment": self.deployment,
                "period": self.period,
                "basis": self.basis,
                "input_per_token": _str(self.input_per_token),
                "output_per_token": _str(self.output_per_token),
                "window_tokens": self.window_tokens,
                "window_replica_s": self.window_replica_s,
                "window_pool_usd": str(self.window_pool_usd),
            }
        )

    @classmethod
    def from_json(cls, pool: GpuPool, text: str | bytes) -> GpuRate:
        data = json.loads(text)
        period = int(data["period"])
        start, end = pool.period_bounds(period)
        w_start, w_end = pool.period_bounds(period - 2)
        return cls(
            deployment=pool.deployment,
            period=period,
            period_start=start,
            period_end=end,
            basis=str(data["basis"]),
            input_per_token=_dec(data["input_per_token"]),
            output_per_token=_dec(data["output_per_token"]),
            window_start=w_start,
            window_end=w_end,
            window_tokens=int(data["window_tokens"]),
            window_replica_s=int(data["window_replica_s"]),
            window_pool_usd=Decimal(data["window_pool_usd"]),
        )

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, for the API (USD per million tokens, as strings)."""
        per_mtok = None if self.input_per_token is None else self.input_per_token * _PER_MTOK
        out_mtok = None if self.output_per_token is None else self.output_per_token * _PER_MTOK
        return {
            "id": self.id,
            "deployment": self.deployment,
            "period_start": self.period_start.isoformat(),
            "period_end": self.period_end.isoformat(),
            "basis": self.basis,
            "input_per_mtok": _str(per_mtok),
            "output_per_mtok": _str(out_mtok),
            "window_start": self.window_start.isoformat(),
            "window_end": self.window_end.isoformat(),
            "window_tokens": self.window_tokens,
            "window_replica_seconds": self.window_replica_s,
            "window_pool_usd": f"{self.window_pool_usd:f}",
        }


def _str(value: Decimal | None) -> str | None:
    return None if value is None else f"{value.normalize():f}"


def _dec(value: object) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def compute_rate(pool: GpuPool, period: int, tokens: int, replica_s: int) -> GpuRate:
    """The rate of ``period`` from what period - 2 recorded (module docstring)."""
    start, end = pool.period_bounds(period)
    w_start, w_end = pool.period_bounds(period - 2)
    pool_usd = pool.replica_hourly_usd * replica_s / Decimal(3600)
    basis = "unknown"
    rate_in = rate_out = None
    planned = pool.planned_per_token
    if tokens > 0 and replica_s > 0:
        rate = pool_usd / tokens
        basis = "measured"
        if pool.max_per_token is not None and rate > pool.max_per_token:
            rate, basis = pool.max_per_token, "measured, capped at max"
        elif pool.min_per_token is not None and rate < pool.min_per_token:
            rate, basis = pool.min_per_token, "measured, raised to min"
        rate_in = rate_out = rate
    elif planned is not None:
        rate_in = rate_out = planned
        basis = "planned"
    elif pool.fallback_input is not None and pool.fallback_output is not None:
        rate_in, rate_out, basis = pool.fallback_input, pool.fallback_output, "settings"
    return GpuRate(
        deployment=pool.deployment,
        period=period,
        period_start=start,
        period_end=end,
        basis=basis,
        input_per_token=rate_in,
        output_per_token=rate_out,
        window_start=w_start,
        window_end=w_end,
        window_tokens=tokens,
        window_replica_s=replica_s,
        window_pool_usd=pool_usd,
    )


class GpuRates:
    """Publishes and reads the pools' rates and counters in Redis; keeps the rates it read."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        pools: Sequence[GpuPool],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._redis_keys = RedisKeys(prefix)
        self._pools = {p.deployment: p for p in pools}
        self._clock = clock

    @property
    def pools(self) -> Mapping[str, GpuPool]:
        return self._pools

    def _key(self, deployment: str, kind: str, suffix: object) -> str:
        return self._redis_keys.gpu_rate(deployment, kind, suffix)

    async def record_tokens(self, tokens: Mapping[str, int], at: float | None = None) -> None:
        """Add ``tokens`` served per pool to the current period's counter."""
        now = self._clock() if at is None else at
        async with self._redis.pipeline(transaction=False) as pipe:
            for deployment, n in tokens.items():
                pool = self._pools.get(deployment)
                if pool is None or n <= 0:
                    continue
                key = self._key(deployment, "ptok", pool.period(now))
                pipe.incrby(key, n)
                pipe.expire(key, pool.period_s * _RATE_KEEP_PERIODS)
            await pipe.execute()

    async def record_running(
        self, deployment: str, replicas: Sequence[str], *, bucket_s: int, at: float | None = None
    ) -> int:
        """Count ``replicas`` as running during the current ``bucket_s`` bucket, once each
        whoever reports them; returns the replica-seconds this call added."""
        pool = self._pools.get(deployment)
        if pool is None or not replicas:
            return 0
        now = self._clock() if at is None else at
        bucket = math.floor(now / bucket_s)
        day = datetime.fromtimestamp(now, UTC).date().isoformat()
        keys = [
            self._key(deployment, "up", bucket),
            self._key(deployment, "rs", pool.period(now)),
            self._key(deployment, "rsday", day),
        ]
        ttl = max(pool.period_s * _RATE_KEEP_PERIODS, 86_400 * 40)
        added = await self._redis.eval(
            _RUNNING_SCRIPT, len(keys), *keys, bucket_s, bucket_s * 3, ttl, *replicas
        )
        return int(added)

    async def replica_seconds_of_day(self, deployment: str, day: date) -> int | None:
        """What the pool's replicas ran on ``day`` (``None``: nothing recorded)."""
        value = await self._redis.get(self._key(deployment, "rsday", day.isoformat()))
        return None if value is None else int(value)

    async def rate(self, deployment: str, period: int) -> GpuRate | None:
        """The rate of ``period``: the published one, else computed and published now (the
        first process to publish wins). ``None`` for a deployment not GPU-priced."""
        pool = self._pools.get(deployment)
        if pool is None:
            return None
        key = self._key(deployment, "rate", period)
        stored = await self._redis.get(key)
        if stored is not None:
            return GpuRate.from_json(pool, stored)
        window = period - 2
        tokens, replica_s = await self._redis.mget(
            [self._key(deployment, "ptok", window), self._key(deployment, "rs", window)]
        )
        rate = compute_rate(pool, period, int(tokens or 0), int(replica_s or 0))
        ttl = pool.period_s * _RATE_KEEP_PERIODS
        if not await self._redis.set(key, rate.to_json(), nx=True, ex=ttl):
            stored = await self._redis.get(key)
            if stored is not None:
                return GpuRate.from_json(pool, stored)
        return rate

    async def current(self, at: float | None = None) -> dict[str, tuple[GpuRate, GpuRate]]:
        """Each pool's rate now and the next period's (published a period ahead)."""
        now = self._clock() if at is None else at
        out = {}
        for name, pool in self._pools.items():
            period = pool.period(now)
            now_rate = await self.rate(name, period)
            next_rate = await self.rate(name, period + 1)
            assert now_rate is not None and next_rate is not None
            out[name] = (now_rate, next_rate)
        return out


# KEYS: the bucket's set, the period's and the day's replica-seconds. ARGV: bucket seconds, the
# set's ttl, the counters' ttl, then the replicas seen running.
_RUNNING_SCRIPT = """
local added = 0
for i = 4, #ARGV do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then added = added + tonumber(ARGV[1]) end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
if added > 0 then
  redis.call('INCRBY', KEYS[2], added); redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
  redis.call('INCRBY', KEYS[3], added); redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
end
return added
"""


class ReplicaClock:
    """Every ``sample_s``, checks each GPU pool's replicas and records those that answer
    ``GET /health`` with 200 as running in the current ``bucket_s`` bucket (``GpuRates``), and
    calls ``refresh`` (``PriceBook.ensure_rates``): a worker idle across several periods still
    holds the rate of the period a job was received in when it books it."""

    def __init__(
        self,
        rates: GpuRates,
        session: aiohttp.ClientSession,
        replicas: Mapping[str, Sequence[str]],
        *,
        bucket_s: int = 10,
        sample_s: float = 4.0,
        timeout_s: float = 2.0,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._refresh = refresh
        self._rates = rates
        self._session = session
        self._pools = frozenset(rates.pools)
        self._replicas = {d: tuple(u) for d, u in replicas.items() if d in self._pools and u}
        self._bucket_s = bucket_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loop = Loop(
            "tiergate-gpu-replica-clock",
            self._sample_and_refresh,
            every_s=sample_s,
            catch=(RedisError, OSError),
            on_error=lambda exc: log.warning(
                "GPU replica record unavailable (%s)", type(exc).__name__
            ),
        )

    def set_replicas(self, deployment: str, urls: Sequence[str]) -> None:
        """A GPU pool's replicas from now on (discovered pods joined or left)."""
        if deployment in self._pools:
            self._replicas[deployment] = tuple(urls)

    async def _up(self, url: str) -> bool:
        try:
            async with self._session.get(health_url(url), timeout=self._timeout) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def sample(self) -> dict[str, int]:
        """One check of every pool; the replica-seconds each pool's record gained."""
        out = {}
        for deployment, urls in list(self._replicas.items()):
            up = await asyncio.gather(*(self._up(u) for u in urls))
            running = [u for u, ok in zip(urls, up, strict=True) if ok]
            out[deployment] = await self._rates.record_running(
                deployment, running, bucket_s=self._bucket_s
            )
        return out

    async def _sample_and_refresh(self) -> None:
        await self.sample()
        if self._refresh is not None:
            await self._refresh()

    def start(self) -> None:
        if self._pools:  # discovered pools may have no replica yet
            self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()
