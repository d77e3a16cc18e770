"""Circuit breaker per deployment, shared by every gateway process through Redis.

States, as Redis keys (all under ``{prefix}:{breaker:<deployment>}:`` so one deployment's keys
share a Cluster slot):

    closed      no ``open`` and no ``tripped`` key: calls go through; each outcome is counted
                in a fixed window (``window``, a hash with ``total`` and ``failures`` and a TTL
                of ``window_s``). When a failure brings the window to ``min_calls`` calls with
                at least ``failure_ratio`` of them failed, the breaker opens.
    open        the ``open`` key exists (TTL ``open_s``): every process skips the deployment.
    half-open   ``open`` expired, ``tripped`` remains: one call at a time may probe (``probe``,
                ``SET NX`` with TTL ``probe_timeout_s``); its success closes the breaker, its
                failure opens it again. Others skip the deployment meanwhile.

Each transition is one Lua script, so concurrent processes agree. Redis being unreachable lets
calls through (the breaker fails open; Redis outages are the queue's concern).

A process keeps a short local view of a closed breaker (``closed_view_s``, default 0.25 s): while
the last check it made found the breaker closed, a call goes ahead and a success is counted
locally, without a Redis round trip. The successes counted meanwhile are added to the window
with the next check or the next failure, and a failure always goes to Redis at once (and ends
the local view). So a breaker another process opened is seen here within ``closed_view_s``,
and the failure ratio is computed over every call, only a moment late for the successes.
The checks are made by ``refresh`` (all breakers in one round trip, from ``BreakerWatch`` in
the background, more often than ``closed_view_s``), so calls to deployments whose breakers
stay closed make none; ``allow`` asks Redis itself only when the view has lapsed, or for a
breaker that is open or half-open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from gateway.queue.keys import RedisKeys

__all__ = ["BreakerConfig", "BreakerState", "RedisBreaker"]

log = logging.getLogger(__name__)


class BreakerState(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    window_s: float = 10.0
    min_calls: int = 4
    failure_ratio: float = 0.5
    open_s: float = 5.0
    probe_timeout_s: float = 10.0
    closed_view_s: float = 0.25
    """How long a check that found the breaker closed is trusted locally (0: always ask)."""

    @property
    def tripped_s(self) -> float:
        """How long a tripped breaker waits for a probe before it forgets (then: closed)."""
        return max(60.0, 10 * self.open_s)


# Successes counted locally join the closed window (ARGV: their number, window_ms).
_ADD_SUCCESSES = """
local function add_successes(window, n, window_ms)
  if n > 0 then
    local total = redis.call('HINCRBY', window, 'total', n)
    if total == n then redis.call('PEXPIRE', window, window_ms) end
  end
end
"""

# KEYS: open, tripped, probe, window. ARGV: probe_ms, local successes, window_ms.
# → 0 closed, 1 probe granted, 2 open, 3 probing
_ALLOW = (
    _ADD_SUCCESSES
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
if redis.call('EXISTS', KEYS[2]) == 1 then
  if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[1]) then return 1 end
  return 3
end
add_successes(KEYS[4], tonumber(ARGV[2]), ARGV[3])
return 0
"""
)

# KEYS: open, tripped, window. ARGV: local successes, window_ms. → 0 closed, 1 half-open, 2 open
_PEEK = (
    _ADD_SUCCESSES
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
add_successes(KEYS[3], tonumber(ARGV[1]), ARGV[2])
return 0
"""
)

# KEYS: window, open, tripped, probe.
# ARGV: ok, window_ms, min_calls, failure_ratio, open_ms, tripped_ms, local successes.
# → new state (0/1/2)
_RECORD = (
    _ADD_SUCCESSES
    + """
local ok = ARGV[1] == '1'
local open = redis.call('EXISTS', KEYS[2]) == 1
if open then return 2 end
if redis.call('EXISTS', KEYS[3]) == 1 then
  if ok then
    redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
    return 0
  end
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[6])
  redis.call('DEL', KEYS[1], KEYS[4])
  return 2
end
add_successes(KEYS[1], tonumber(ARGV[7]), ARGV[2])
local total = redis.call('HINCRBY', KEYS[1], 'total', 1)
if total == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if ok then return 0 end
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
if total >= tonumber(ARGV[3]) and failures >= tonumber(ARGV[4]) * total then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[6])
  redis.call('DEL', KEYS[1], KEYS[4])
  return 2
end
return 0
"""
)

OnState = Callable[[str, BreakerState], None]


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisBreaker:
    """The breakers of every deployment, under one key prefix."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        config: BreakerConfig | None = None,
        *,
        on_state: OnState | None = None,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._redis_keys = RedisKeys(prefix)
        self.config = config or BreakerConfig()
        self._on_state = on_state
        self._allow = redis.register_script(_ALLOW)
        self._record = redis.register_script(_RECORD)
        self._peek = redis.register_script(_PEEK)
        self._closed_until: dict[str, float] = {}
        """Deployment -> monotonic time until which its breaker is taken as closed here."""
        self._unsent: dict[str, int] = {}
        """Deployment -> successes counted locally, not yet added to its window."""
        self._dropped: dict[str, int] = {}
        """Deployment -> how often its local view was dropped (a refresh in flight meanwhile
        must not renew it)."""

    def _keys(self, deployment: str) -> tuple[str, str, str, str]:
        return self._redis_keys.breaker(deployment)

    def _notify(self, deployment: str, state: BreakerState) -> None:
        if self._on_state is not None:
            self._on_state(deployment, state)

    def _drop_view(self, deployment: str) -> None:
        self._closed_until.pop(deployment, None)
        self._dropped[deployment] = self._dropped.get(deployment, 0) + 1

    def _closed_here(self, deployment: str) -> bool:
        return self._closed_until.get(deployment, 0.0) > time.monotonic()

    async def allow(self, deployment: str) -> bool:
        """Whether a call to ``deployment`` may go ahead now (a half-open probe counts)."""
        if self._closed_here(deployment):
            return True
        window, open_key, tripped, probe = self._keys(deployment)
        unsent = self._unsent.pop(deployment, 0)
        try:
            code = int(
                await self._allow(
                    keys=[open_key, tripped, probe, window],
                    args=[_ms(self.config.probe_timeout_s), unsent, _ms(self.config.window_s)],
                )
            )
        except RedisError as exc:
            log.warning("breaker check for %s failed open: %r", deployment, exc)
            return True
        if code == 0 and self.config.closed_view_s > 0:
            self._closed_until[deployment] = time.monotonic() + self.config.closed_view_s
        self._notify(
            deployment,
            {0: BreakerState.CLOSED, 2: BreakerState.OPEN}.get(code, BreakerState.HALF_OPEN),
        )
        return code in (0, 1)

    async def record(self, deployment: str, *, ok: bool) -> BreakerState:
        """Count one call's outcome; the breaker's state afterwards."""
        if ok and self._closed_here(deployment):
            self._unsent[deployment] = self._unsent.get(deployment, 0) + 1
            return BreakerState.CLOSED
        self._drop_view(deployment)
        unsent = self._unsent.pop(deployment, 0)
        c = self.config
        try:
            code = int(
                await self._record(
                    keys=list(self._keys(deployment)),
                    args=[
                        1 if ok else 0,
                        _ms(c.window_s),
                        c.min_calls,
                        c.failure_ratio,
                        _ms(c.open_s),
                        _ms(c.tripped_s),
                        unsent,
                    ],
                )
            )
        except RedisError as exc:
            log.warning("breaker record for %s lost: %r", deployment, exc)
            return BreakerState.CLOSED
        state = BreakerState(code)
        if state is BreakerState.OPEN:
            log.warning("circuit breaker for %s is open", deployment)
        self._notify(deployment, state)
        return state

    async def state(self, deployment: str) -> BreakerState:
        _, open_key, tripped, _ = self._keys(deployment)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(open_key)
            pipe.exists(tripped)
            is_open, is_tripped = await pipe.execute()
        if is_open:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN if is_tripped else BreakerState.CLOSED

    async def refresh(self, deployments: Iterable[str]) -> dict[str, BreakerState]:
        """Every breaker's state, in one round trip. On the way, the successes counted here
        join their windows, and the local view of each closed breaker is renewed for
        ``closed_view_s`` from the moment of asking (unless a failure or a trip dropped it
        meanwhile), so a process refreshing more often than that never asks Redis on a
        call's path while its breakers stay closed. ``RedisError`` propagates."""
        names = list(deployments)
        dropped = {name: self._dropped.get(name, 0) for name in names}
        unsent = {name: self._unsent.pop(name, 0) for name in names}
        asked = time.monotonic()
        window_ms = _ms(self.config.window_s)
        try:
            codes = await self._peek_all(names, unsent, window_ms)
        except RedisError:
            for name, count in unsent.items():  # counted again with the next check
                if count:
                    self._unsent[name] = self._unsent.get(name, 0) + count
            raise
        states = {name: BreakerState(int(code)) for name, code in zip(names, codes, strict=True)}
        view_s = self.config.closed_view_s
        for name, state in states.items():
            if (
                state is BreakerState.CLOSED
                and view_s > 0
                and self._dropped.get(name, 0) == dropped[name]
            ):
                self._closed_until[name] = asked + view_s
        return states

    async def _peek_all(
        self, names: list[str], unsent: dict[str, int], window_ms: int
    ) -> list[Any]:
        """The peek script for every breaker, pipelined as plain ``EVALSHA`` (a pipeline of
        registered scripts would ask ``SCRIPT EXISTS`` first: a second round trip each time);
        loaded and sent again if Redis has lost it (none of them ran then)."""
        try:
            return await self._peek_pipelined(names, unsent, window_ms)
        except NoScriptError:
            await self._redis.script_load(_PEEK)
            return await self._peek_pipelined(names, unsent, window_ms)

    async def _peek_pipelined(
        self, names: list[str], unsent: dict[str, int], window_ms: int
    ) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                window, open_key, tripped, _ = self._keys(name)
                pipe.evalsha(self._peek.sha, 3, open_key, tripped, window, unsent[name], window_ms)
            return list(await pipe.execute())

    async def unavailable(self, deployments: Iterable[str]) -> frozenset[str]:
        """The deployments whose breaker is open now (for the router's ``Signals.unavailable``);
        half-open ones are not listed, so that requests reach them and probe. Empty when Redis
        cannot be read."""
        names = list(deployments)
        if not names:
            return frozenset()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.exists(self._keys(name)[1])
                flags = await pipe.execute()
        except RedisError:
            return frozenset()
        return frozenset(name for name, flag in zip(names, flags, strict=True) if flag)

    async def trip(self, deployment: str) -> None:
        """Open the breaker now (its replicas fail their health checks): skipped for
        ``open_s``, then half-open as after any trip. Redis errors are logged."""
        window, open_key, tripped, probe = self._keys(deployment)
        self._drop_view(deployment)
        c = self.config
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(open_key, b"1", px=_ms(c.open_s))
                pipe.set(tripped, b"1", px=_ms(c.tripped_s))
                pipe.delete(window, probe)
                await pipe.execute()
        except RedisError as exc:
            log.warning("cannot trip the breaker of %s: %r", deployment, exc)
            return
        self._notify(deployment, BreakerState.OPEN)

    async def reset(self, deployment: str) -> None:
        self._drop_view(deployment)
        self._unsent.pop(deployment, None)
        await self._redis.delete(*self._keys(deployment))
