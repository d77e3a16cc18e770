"""The router's output: what to try, in which order, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.catalog import Tier

__all__ = ["RoutePlan"]


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """An ordered list of deployments to try for one request.

    ``tier`` is the tier chosen for the first attempt; later entries of ``deployments`` are the
    fallback chain. ``rule`` names what decided (e.g. ``auto:threshold``, ``pin:model``), and
    ``reason`` says it in words for people.
    """

    tier: Tier
    deployments: tuple[str, ...]
    rule: str
    reason: str
    score: float | None = None
    requested_model: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier.value,
            "deployments": list(self.deployments),
            "rule": self.rule,
            "reason": self.reason,
            "score": self.score,
            "requested_model": self.requested_model,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoutePlan:
        score = data.get("score")
        return cls(
            tier=Tier(data["tier"]),
            deployments=tuple(data["deployments"]),
            rule=str(data["rule"]),
            reason=str(data["reason"]),
            score=None if score is None else float(score),
            requested_model=str(data.get("requested_model", "auto")),
        )
