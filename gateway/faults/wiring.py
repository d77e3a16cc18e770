"""From settings to the fault-handling parts (called by ``gateway.services``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from gateway.faults.breaker import BreakerConfig, BreakerState, RedisBreaker
from gateway.faults.chains import TierFaults
from gateway.faults.policy import RetryPolicy
from router.catalog import Tier

if TYPE_CHECKING:
    from gateway.settings import DeploymentSettings, FallbackSettings, Settings

__all__ = ["backend_timeouts", "make_breaker", "tier_faults", "vllm_deployments"]

_STATE_NAMES = {
    BreakerState.CLOSED: "closed",
    BreakerState.HALF_OPEN: "half_open",
    BreakerState.OPEN: "open",
}


def tier_faults(settings: FallbackSettings) -> dict[Tier, TierFaults]:
    out: dict[Tier, TierFaults] = {}
    for tier in Tier:
        cfg = settings.for_tier(tier)
        r = cfg.retry
        out[tier] = TierFaults(
            retry=RetryPolicy(
                max_attempts=r.max_attempts,
                backoff_initial_s=r.backoff_initial_s,
                backoff_max_s=r.backoff_max_s,
                jitter_s=r.jitter_s,
                retry_after_cap_s=r.retry_after_cap_s,
                retry_on=frozenset(r.retry_on),
            ),
            attempt_s=cfg.timeouts.attempt_s,
            first_token_s=cfg.timeouts.first_token_s,
            first_byte_s=cfg.timeouts.first_byte_s,
            share=settings.attempt_share,
        )
    return out


def backend_timeouts(settings: FallbackSettings, dep: DeploymentSettings) -> dict[str, float]:
    """Keyword arguments for a backend's constructor: connect, first-token, stall, total,
    first-byte."""
    t = settings.for_tier(dep.tier).timeouts
    return {
        "connect_s": t.connect_s,
        "first_token_s": t.first_token_s,
        "stall_s": t.stall_s,
        "total_s": min(dep.timeout_s, t.attempt_s),
        "first_byte_s": t.first_byte_s,
    }


def make_breaker(
    settings: FallbackSettings,
    redis: aioredis.Redis,
    prefix: str,
    set_state: Callable[[str, str], None] | None = None,
) -> RedisBreaker | None:
    b = settings.breaker
    if not b.enabled:
        return None

    def on_state(deployment: str, state: BreakerState) -> None:
        if set_state is not None:
            set_state(deployment, _STATE_NAMES[state])

    config = BreakerConfig(
        window_s=b.window_s,
        min_calls=b.min_calls,
        failure_ratio=b.failure_ratio,
        open_s=b.open_s,
        probe_timeout_s=b.probe_timeout_s,
        closed_view_s=b.closed_view_s,
    )
    return RedisBreaker(redis, prefix, config, on_state=on_state)


def vllm_deployments(settings: Settings) -> list[DeploymentSettings]:
    """The deployments with a health endpoint (hosted APIs have none)."""
    return [d for d in settings.deployments if d.provider == "vllm" and d.replicas]
