"""Fault handling: retry policy, circuit breakers, downgrade flags, stream continuation.

See docs/fallback.md for how they fit together in the executor.
"""

from gateway.faults.breaker import BreakerConfig, BreakerState, RedisBreaker
from gateway.faults.chains import TierFaults, is_downgrade
from gateway.faults.continuation import Delivered, can_continue, continuation_body
from gateway.faults.policy import RetryPolicy

__all__ = [
    "BreakerConfig",
    "BreakerState",
    "Delivered",
    "RedisBreaker",
    "RetryPolicy",
    "TierFaults",
    "can_continue",
    "continuation_body",
    "is_downgrade",
]
