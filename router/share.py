"""A tenant's own score distribution, for ``target_large_share`` that holds on its own mix.

The model file's share curve (``router.classifier.threshold_for_share``) is read off one
documented mix of prompts; a tenant whose traffic is all exam questions sends far more than the
target share large at that threshold. The gateway keeps, per tenant, a quantile table of the
classifier scores of its recent requests (``gateway.rules.score_mix``) and hands it to the
planner in ``Signals.own_scores``; the planner uses it once it holds at least
``Signals.min_own_scores`` scores. Pure: tables are plain frozen data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["QUANTILE_POINTS", "ScoreQuantiles", "ShareCurve", "ShareSource", "quantile_table"]

QUANTILE_POINTS = 101
"""Points of a quantile table: the 0th, 1st, …, 100th percentile."""


def _at(points: Sequence[float], q: float) -> float:
    """Linear interpolation of evenly spaced ``points`` (quantiles 0..1) at ``q`` in [0, 1]."""
    position = q * (len(points) - 1)
    low = min(math.floor(position), len(points) - 2)
    frac = position - low
    return points[low] + (points[low + 1] - points[low]) * frac


def quantile_table(scores: Sequence[float], size: int = QUANTILE_POINTS) -> tuple[float, ...]:
    """``size`` evenly spaced quantiles (0 to 1) of ``scores``, linearly interpolated between
    the sorted scores. Raises ``ValueError`` for no scores or ``size`` < 2."""
    if size < 2:
        raise ValueError("a quantile table needs at least two points")
    if not scores:
        raise ValueError("no scores")
    ordered = sorted(scores)
    if len(ordered) == 1:
        return (ordered[0],) * size
    return tuple(_at(ordered, i / (size - 1)) for i in range(size))


@dataclass(frozen=True, slots=True)
class ScoreQuantiles:
    """The classifier scores of one tenant's recent requests, as a quantile table."""

    points: tuple[float, ...]
    """``points[i]``: the score quantile ``i / (len(points) - 1)`` (non-decreasing)."""
    count: int
    """How many scores the table was made from."""
    window_days: float
    """How far back the scores go at most (the newest ``count`` within it)."""

    def __post_init__(self) -> None:
        if len(self.points) < 2:
            raise ValueError("a quantile table needs at least two points")
        if any(b < a for a, b in zip(self.points, self.points[1:], strict=False)):
            raise ValueError("quantiles must be non-decreasing")

    def threshold_for_share(self, share: float) -> float:
        """The threshold at which ``share`` (clamped to 0..1) of these scores is at or above it:
        the ``1 - share`` quantile. Share 0 gives a threshold above every score."""
        if math.isnan(share):
            raise ValueError("share is NaN")
        share = min(1.0, max(0.0, share))
        if share == 0.0:
            return math.nextafter(self.points[-1], math.inf)
        return _at(self.points, 1.0 - share)


class ShareCurve(StrEnum):
    TENANT = "tenant"
    """The tenant's own recent scores."""
    MIX = "mix"
    """The model file's documented validation mix."""


@dataclass(frozen=True, slots=True)
class ShareSource:
    """Which curve turned a rule's ``target_large_share`` into the threshold, for explain."""

    share: float
    curve: ShareCurve
    scores: int | None = None
    """The tenant's scores the table holds (also when too few for ``TENANT``)."""
    window_days: float | None = None
    min_scores: int | None = None

    def describe(self) -> str:
        if self.curve is ShareCurve.TENANT:
            return (
                f"target {self.share:.0%} large on the tenant's own last {self.scores} scores "
                f"(≤ {self.window_days:g} days)"
            )
        why = ""
        if self.min_scores is not None:
            why = f"; the tenant has {self.scores or 0} scores, fewer than {self.min_scores}"
        return f"target {self.share:.0%} large on the documented mix{why}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "curve": self.curve.value,
            "scores": self.scores,
            "window_days": self.window_days,
            "min_scores": self.min_scores,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShareSource:
        return cls(
            share=float(data["share"]),
            curve=ShareCurve(data["curve"]),
            scores=data.get("scores"),
            window_days=data.get("window_days"),
            min_scores=data.get("min_scores"),
        )
