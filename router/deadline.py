"""Whether a tier can still answer a request before its deadline, from the plan's inputs alone.

A tier is *late* for a request when something waits there (its expected wait is over 0) and
that wait plus the tier's typical job time is more than the time the request has left. The
typical job time is the allowance: a worker does not start a job with less time left than that
(``Worker._cannot_finish``), and deadline admission (``gateway.queue.edge.deadline``) judges the
same "time left to start". A tier where nothing waits starts the job at once and is never late: how
long the model takes is not the queue's doing.

Pure: the time left comes in through ``RequestContext.time_left_s`` (the edge reads the clock),
the waits and job times through ``Signals`` (the queue snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.catalog import Signals, Tier

__all__ = ["TierFit", "tier_fit"]


@dataclass(frozen=True, slots=True)
class TierFit:
    """One tier's expected wait and typical job time against a request's time left."""

    tier: Tier
    wait_s: float
    job_s: float
    time_left_s: float

    @property
    def late(self) -> bool:
        """Not expected to start with a typical job's time still left before the deadline."""
        return self.wait_s > 0 and self.wait_s + self.job_s > self.time_left_s

    def describe(self) -> str:
        """E.g. ``large tier's expected wait 12.0 s + a typical job 6.0 s``."""
        job = f" + a typical job {self.job_s:.1f} s" if self.job_s > 0 else ""
        return f"{self.tier.value} tier's expected wait {self.wait_s:.1f} s{job}"


def tier_fit(tier: Tier, time_left_s: float, signals: Signals) -> TierFit:
    """``tier``'s figures from ``signals`` (no estimate: 0, i.e. not late)."""
    return TierFit(
        tier=tier,
        wait_s=signals.expected_wait_s.get(tier, 0.0),
        job_s=signals.service_s.get(tier, 0.0),
        time_left_s=time_left_s,
    )
