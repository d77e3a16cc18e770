"""Per-tenant rate limits: requests and tokens per minute, one atomic Lua script in Redis.

Each limit is a token bucket holding at most one minute's allowance and refilling continuously
(``limit / 60`` per second), on Redis's clock, so every gateway process shares it. A request
needs one unit of the request bucket and, of the token bucket, its estimated prompt tokens plus
its output budget (``max_tokens``, or the default); both are taken or neither. A refusal says
when enough will have refilled (``Retry-After``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import RateLimited, ServiceUnavailable

__all__ = ["RateLimiter", "TenantRates"]

_TAKE = """
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


@dataclass(frozen=True, slots=True)
class TenantRates:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


class RateLimiter:
    def __init__(
        self, redis: aioredis.Redis, prefix: str, rates: Mapping[str, TenantRates]
    ) -> None:
        self._prefix = prefix
        self._rates = {
            t: r for t, r in rates.items() if r.requests_per_minute or r.tokens_per_minute
        }
        self._take = redis.register_script(_TAKE)

    def _keys(self, tenant: str) -> list[str]:
        tag = f"{self._prefix}:{{rl:{tenant}}}"
        return [f"{tag}:requests", f"{tag}:tokens"]

    async def admit(self, tenant: str, *, tokens: int) -> None:
        """Take one request and ``tokens`` tokens of ``tenant``'s allowance, or raise
        ``RateLimited`` (429 ``rate_limit_exceeded``) and take nothing."""
        rates = self._rates.get(tenant)
        if rates is None:
            return
        args: list[int] = [
            rates.requests_per_minute or 0,
            1,
            rates.tokens_per_minute or 0,
            max(tokens, 0),
        ]
        try:
            wait_ms: Any = await self._take(keys=self._keys(tenant), args=args)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(f"rate limits unavailable: {type(exc).__name__}") from exc
        if int(wait_ms) > 0:
            raise RateLimited(
                f"tenant {tenant!r} is over its rate limit",
                code="rate_limit_exceeded",
                retry_after=float(max(math.ceil(int(wait_ms) / 1000), 1)),
            )
