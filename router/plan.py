"""The router's output: what to try, in which order, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.catalog import Tier
from router.share import ShareSource

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
    threshold: float | None = None
    """The classifier threshold in force for ``auto`` (the tenant's, or the fired rule's
    ``threshold`` / ``target_large_share``); ``None`` for a pinned request."""
    alias: str | None = None
    """The model alias that turned ``requested_model`` into what was planned
    (``"gpt-4o* → large"``); ``None``: no alias."""
    preferred: str | None = None
    """The deployment the plan would start with, when it was unavailable (its breaker open:
    a failing or drained deployment, or a whole tier drained) and moved to the end; ``None``:
    ``deployments[0]`` is it. An answer from another deployment is a fallback from it."""
    share_source: ShareSource | None = None
    """For a rule's ``target_large_share``: which curve set the threshold (the tenant's own
    recent scores, or the documented mix); ``None`` otherwise."""
    needs: tuple[str, ...] = ()
    """The capabilities the request needs (``router.capabilities``: ``vision``, ``tools``,
    ``json_schema``, ``reasoning``)."""
    ruled_out: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``(deployment, capabilities it lacks)`` for each deployment ``needs`` ruled out."""
    fallbacks_of: str | None = None
    """The named deployment whose configured ``fallbacks`` make the rest of ``deployments``;
    ``None``: no configured chain (tier order, or one deployment alone)."""
    dropped: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``(deployment, body fields it is not sent)`` for each deployment of ``deployments`` that
    a hint of the request does not reach (``router.capabilities.unsent``: reasoning parameters
    of a request that named its model through an alias)."""

    def dropped_for(self, deployment: str | None) -> tuple[str, ...]:
        """The body fields ``deployment`` is not sent (``dropped``)."""
        return next((fields for d, fields in self.dropped if d == deployment), ())

    @property
    def first_choice(self) -> str | None:
        """The deployment the router meant to answer: ``preferred``, else the first."""
        return self.preferred or (self.deployments[0] if self.deployments else None)

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
            "threshold": self.threshold,
            "alias": self.alias,
            "preferred": self.preferred,
            "share_source": None if self.share_source is None else self.share_source.to_dict(),
            "needs": list(self.needs),
            "ruled_out": [{"deployment": d, "missing": list(m)} for d, m in self.ruled_out],
            "fallbacks_of": self.fallbacks_of,
            "dropped": [{"deployment": d, "fields": list(f)} for d, f in self.dropped],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoutePlan:
        score = data.get("score")
        share = data.get("share_source")
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
            threshold=data.get("threshold"),
            alias=data.get("alias"),
            preferred=data.get("preferred"),
            share_source=None if share is None else ShareSource.from_dict(share),
            needs=tuple(str(c) for c in data.get("needs", ())),
            ruled_out=tuple(
                (str(r["deployment"]), tuple(str(c) for c in r["missing"]))
                for r in data.get("ruled_out", ())
            ),
            fallbacks_of=data.get("fallbacks_of"),
            dropped=tuple(
                (str(r["deployment"]), tuple(str(f) for f in r["fields"]))
                for r in data.get("dropped", ())
            ),
        )
