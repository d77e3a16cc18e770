"""The fallback chain's data: per-tier policy and timeouts, and what counts as a downgrade.

The chain itself is the ``RoutePlan``'s deployments, in order (the planner builds it). Serving
from a lower quality rank than the plan's primary tier is a downgrade, flagged to the client
(``x-tiergate-downgraded: true``) and in the ledger (tag ``tiergate:downgraded``). Ranks:
``small`` 0, ``large`` and ``external`` 1 — so 70B → external is not a downgrade, 70B or
external → 8B is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.faults.policy import RetryPolicy
from router.catalog import Tier

__all__ = ["DOWNGRADE_TAG", "TierFaults", "is_downgrade"]

DOWNGRADE_TAG = "tiergate:downgraded"
_RANK = {Tier.SMALL: 0, Tier.LARGE: 1, Tier.EXTERNAL: 1}


def is_downgrade(planned: Tier, served: Tier) -> bool:
    return _RANK[served] < _RANK[planned]


@dataclass(frozen=True, slots=True)
class TierFaults:
    """Retry policy and per-attempt timeout of one tier."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    attempt_s: float = 60.0
