"""From settings to the fault-handling parts (called by ``gateway.services``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis
from pydantic import BaseModel

from gateway.faults.breaker import BreakerConfig, BreakerState, RedisBreaker
from gateway.faults.chains import TierFaults
from gateway.faults.policy import RetryPolicy
from router.catalog import Tier

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from gateway.settings import DeploymentSettings, FallbackSettings, Settings

__all__ = ["backend_timeouts", "configured", "make_breaker", "tier_faults", "vllm_deployments"]

T = TypeVar("T", bound="DataclassInstance")

_STATE_NAMES = {
    BreakerState.CLOSED: "closed",
    BreakerState.HALF_OPEN: "half_open",
    BreakerState.OPEN: "open",
}


def configured(cls: type[T], settings: BaseModel, **overrides: Any) -> T:
    """A ``cls`` whose every field is read from ``settings``' field of the same name (or given
    in ``overrides``): a field the settings lack fails here, at start-up, rather than keeping
    the dataclass's default unseen. ``tests/gateway/faults/test_wiring.py`` checks that each
    pair's defaults agree."""
    values = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name not in overrides}
    return cls(**values, **overrides)


def tier_faults(settings: FallbackSettings) -> dict[Tier, TierFaults]:
    out: dict[Tier, TierFaults] = {}
    for tier in Tier:
        cfg = settings.for_tier(tier)
        r = cfg.retry
        out[tier] = TierFaults(
            retry=configured(RetryPolicy, r, retry_on=frozenset(r.retry_on)),
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

    return RedisBreaker(redis, prefix, configured(BreakerConfig, b), on_state=on_state)


def vllm_deployments(settings: Settings) -> list[DeploymentSettings]:
    """The deployments with a health endpoint (hosted APIs have none)."""
    return [d for d in settings.deployments if d.provider == "vllm" and d.replicas]
