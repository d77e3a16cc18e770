"""The fallback chain's data: per-tier policy and timeouts, and what counts as a downgrade.

The chain itself is the ``RoutePlan``'s deployments, in order (the planner builds it). Serving
from a lower quality rank than the plan's primary tier is a downgrade, flagged to the client
(``x-tiergate-downgraded: true``) and in the ledger (tag ``tiergate:downgraded``). Ranks:
``small`` 0, ``large`` and ``external`` 1 — so 70B → external is not a downgrade, 70B or
external → 8B is.
"""

from __future__ import annotations

import math
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
    """Retry policy and per-attempt timeouts of one tier."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    attempt_s: float = 60.0
    first_token_s: float | None = None
    """Streams: the wait for the first chunk (``None``: the backend's own, no share)."""
    first_byte_s: float | None = None
    """Non-streamed calls: the wait for the response's first byte (``None``: as above)."""
    share: float = 0.5
    """While other deployments are left to try: the most of the time left before the
    deadline an attempt waits for its first output (``FallbackSettings.attempt_share``)."""

    def first_wait(self, *, stream: bool, time_left: float, last: bool) -> float | None:
        """How long an attempt waits for its first chunk (``stream``) or byte: the tier's
        limit, at most ``share`` of ``time_left`` so the rest of the plan keeps its time;
        no limit (``math.inf``: only the attempt's total) when it is the ``last`` to try, so a
        slow but working answer is not failed with nowhere else to go."""
        if last:
            return math.inf
        limit = self.first_token_s if stream else self.first_byte_s
        if limit is None:
            return None
        return max(min(limit, self.share * time_left), 0.001)

    def stall(self, *, last: bool) -> float | None:
        """The stall limit of an attempt: the backend's own; none when it is the ``last``."""
        return math.inf if last else None
