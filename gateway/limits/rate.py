"""Per-tenant rate limits: requests and tokens per minute, one atomic Lua script in Redis.

Each limit is a token bucket holding at most one minute's allowance and refilling continuously
(``limit / 60`` per second), on Redis's clock, so every gateway process shares it. A request
needs one unit of the request bucket and, of the token bucket, its estimated prompt tokens plus
its output budget (``max_tokens``, or the default); both are taken or neither. A refusal says
when enough will have refilled (``Retry-After``).

After a Redis loss the buckets are rebuilt from the SQL ledger, not started full. The tenant's
``…:seeded`` marker (kept a day, renewed by every check) tells a bucket that expired while the
tenant was idle (full again, rightly) from one that was lost with the rest of Redis (marker gone
too). Without the marker the take script answers "unseeded" and hands one caller a short lock
(``…:seeding``, ``SET NX``): that caller reads the tenant's last minute from the ledger, replays
it into the buckets as they would have refilled (``replay_level``), and sets levels and marker in
one script; every other caller, in any process, retries until the marker is there. So a burst
after a loss costs one query per tenant, and the normal request path never touches SQL.

What a rebuild counts: the ledger's rows of the last 60 s that the limits charged (routed, not
refused by the limits themselves), one request each and their actual prompt + completion tokens
(the estimate the limiter charged is not stored; actual usage is usually below it). Requests in
flight during the loss, not yet in the ledger, are missed. If SQL cannot answer within
``SEED_TIMEOUT_S``, the buckets are seeded full (as before the rebuild existed) with a warning:
rate limits never refuse for want of their history.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.errors import RateLimited, ServiceUnavailable
from gateway.queue.keys import RedisKeys

__all__ = ["RateLimiter", "RateUsageSource", "TenantRates", "replay_level"]

log = logging.getLogger(__name__)

WINDOW_S = 60
SEED_TIMEOUT_S = 1.0
"""How long the ledger may take to answer a rebuild before the buckets are seeded full."""
SEED_LOCK_MS = 2_000
"""How long one caller holds the right to seed (a caller that died frees it by expiry)."""
MARKER_TTL_MS = 86_400_000
_RETRY_S = 0.01
_MAX_ROUNDS = 500
"""Rounds of waiting for another caller's seed (about 5 s, longer than the lock lives)."""

_UNSEEDED, _SEEDING_ELSEWHERE = -1, -2

_TAKE = """
if ARGV[5] == '1' then
  if redis.call('EXISTS', KEYS[3]) == 0 then
    if redis.call('SET', KEYS[4], '1', 'NX', 'PX', tonumber(ARGV[6])) then return -1 end
    return -2
  end
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait, levels = 0, {}
for i = 1, 2 do
  local limit, cost = tonumber(ARGV[i * 2 - 1]), tonumber(ARGV[i * 2])
  if limit > 0 then
    cost = math.min(cost, limit)
    local state = redis.call('HMGET', KEYS[i], 'level', 'ts')
    local level, ts = tonumber(state[1]), tonumber(state[2])
    if not level then level, ts = limit, now end
    level = math.min(limit, level + (now - ts) * limit / 60000)
    levels[i] = level - cost
    if level < cost then
      wait = math.max(wait, math.ceil((cost - level) * 60000 / limit))
    end
  end
end
if wait > 0 then return wait end
for i = 1, 2 do
  if levels[i] then
    redis.call('HSET', KEYS[i], 'level', levels[i], 'ts', now)
    redis.call('PEXPIRE', KEYS[i], 120000)
  end
end
return 0
"""

_SEED = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, 2 do
  if ARGV[i] ~= '' and redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('HSET', KEYS[i], 'level', ARGV[i], 'ts', now)
    redis.call('PEXPIRE', KEYS[i], 120000)
  end
end
redis.call('SET', KEYS[3], now, 'PX', tonumber(ARGV[3]))
redis.call('DEL', KEYS[4])
return 1
"""


class RateUsageSource(Protocol):
    """Where buckets are rebuilt from (``SqlLedger.rate_usage``)."""

    async def rate_usage(
        self, tenant: str, start: datetime, end: datetime
    ) -> list[tuple[datetime, int]]: ...


@dataclass(frozen=True, slots=True)
class TenantRates:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


def replay_level(
    limit: int, charges: Sequence[tuple[float, int]], *, start: float, now: float
) -> float:
    """The level at ``now`` of a bucket of ``limit`` per minute that was full at ``start`` and
    was charged ``cost`` at each ``(time, cost)`` (in time order), refilling as the take script
    does: ``limit / 60`` per second, never above ``limit``, never below zero (the live bucket
    refuses rather than go negative)."""
    rate = limit / WINDOW_S
    level, at = float(limit), start
    for when, cost in charges:
        when = min(max(when, at), now)
        level = min(float(limit), level + (when - at) * rate)
        level = max(0.0, level - min(cost, limit))
        at = when
    return min(float(limit), level + (now - at) * rate)


class RateLimiter:
    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        rates: Mapping[str, TenantRates],
        *,
        ledger: RateUsageSource | None = None,
    ) -> None:
        """``rates``: each tenant's limits, read at every check (a live view such as
        ``TenantDirectory.rates``: a change applies to the next request); ``ledger``: rebuilds
        lost buckets from SQL (none: a lost bucket starts full)."""
        self._redis_keys = RedisKeys(prefix)
        self._ledger = ledger
        self._rates = rates
        self._take = redis.register_script(_TAKE)
        self._seed_script = redis.register_script(_SEED)

    def _keys(self, tenant: str) -> list[str]:
        return self._redis_keys.rate_buckets(tenant)

    async def admit(self, tenant: str, *, tokens: int) -> None:
        """Take one request and ``tokens`` tokens of ``tenant``'s allowance, or raise
        ``RateLimited`` (429 ``rate_limit_exceeded``) and take nothing."""
        rates = self._rates.get(tenant)
        if rates is None or not (rates.requests_per_minute or rates.tokens_per_minute):
            return
        keys = self._keys(tenant)
        args: list[int] = [
            rates.requests_per_minute or 0,
            1,
            rates.tokens_per_minute or 0,
            max(tokens, 0),
            1 if self._ledger is not None else 0,
            SEED_LOCK_MS,
            MARKER_TTL_MS,
        ]
        try:
            for _ in range(_MAX_ROUNDS):
                wait_ms = int(await self._take(keys=keys, args=args))
                if wait_ms == _UNSEEDED:
                    await self._seed(tenant, rates)
                elif wait_ms == _SEEDING_ELSEWHERE:
                    await asyncio.sleep(_RETRY_S)
                else:
                    break
            else:  # the seeding caller vanished and its lock never expired: admit, as before
                log.warning(
                    "rate limits of %s: no seed after %d rounds; admitted", tenant, _MAX_ROUNDS
                )
                return
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"rate limits unavailable: {type(exc).__name__}") from exc
        if wait_ms > 0:
            raise RateLimited(
                f"tenant {tenant!r} is over its rate limit",
                code="rate_limit_exceeded",
                retry_after=float(max(math.ceil(wait_ms / 1000), 1)),
            )

    async def _seed(self, tenant: str, rates: TenantRates) -> None:
        """Rebuild ``tenant``'s buckets from the ledger's last minute (full if SQL cannot say),
        set the marker and free the lock, in one script."""
        assert self._ledger is not None
        now = time.time()
        end = datetime.fromtimestamp(now, UTC)
        levels: list[str] = ["", ""]
        try:
            async with asyncio.timeout(SEED_TIMEOUT_S):
                rows = await self._ledger.rate_usage(tenant, end - timedelta(seconds=WINDOW_S), end)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            log.warning(
                "rate limits of %s not rebuilt from the ledger (%s): buckets start full",
                tenant,
                type(exc).__name__,
            )
            rows = []
        start = now - WINDOW_S
        requests = [(at.timestamp(), 1) for at, _tokens in rows]
        tokens = [(at.timestamp(), used) for at, used in rows]
        for i, (limit, charges) in enumerate(
            ((rates.requests_per_minute, requests), (rates.tokens_per_minute, tokens))
        ):
            if limit:
                levels[i] = f"{replay_level(limit, charges, start=start, now=now):.3f}"
        seeded: Any = await self._seed_script(
            keys=self._keys(tenant), args=[*levels, MARKER_TTL_MS]
        )
        if int(seeded):
            log.info(
                "rate limits of %s rebuilt from the ledger: %d requests in the last %d s; "
                "levels %s",
                tenant,
                len(rows),
                WINDOW_S,
                "/".join(levels),
            )
