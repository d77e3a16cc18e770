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
    skipped_rules: tuple[tuple[str, str], ...] = ()
    """``(rule id, why it did not match)`` for each rule tried before the one that fired."""
    max_tokens: int | None = None
    """A rule's cap on the output tokens (the edge lowers the request's limit to it)."""
    priority: str | None = None
    """A rule's queue priority (wins over the request's and the tenant's)."""
    continuation: bool | None = None
    """A rule's say on continuing a broken stream on another deployment (``None``: default)."""
    max_cost_usd: str | None = None
    """A rule's cap on the worst-case cost per request (decimal string), already applied."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier.value,
            "deployments": list(self.deployments),
            "rule": self.rule,
            "reason": self.reason,
            "score": self.score,
            "requested_model": self.requested_model,
            "skipped_rules": [list(s) for s in self.skipped_rules],
            "max_tokens": self.max_tokens,
            "priority": self.priority,
            "continuation": self.continuation,
            "max_cost_usd": self.max_cost_usd,
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
            skipped_rules=tuple((str(a), str(b)) for a, b in data.get("skipped_rules", ())),
            max_tokens=data.get("max_tokens"),
            priority=data.get("priority"),
            continuation=data.get("continuation"),
            max_cost_usd=data.get("max_cost_usd"),
        )
