"""What rules may look at besides the prompt: who asks, with which metadata, and when."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from router.catalog import Tier

__all__ = ["RequestContext"]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Request attributes for rule conditions, and the conversation's sticky tier.

    The gateway fills it before the (pure) decision: ``now`` is read there, and so are
    ``sticky_tier`` (the tier an earlier turn of the same conversation went to) and
    ``time_left_s`` (from the same deadline the request's job gets).
    """

    app: str | None = None
    tags: tuple[str, ...] = ()
    user: str | None = None
    now: datetime | None = None
    """Aware time of the request; ``None``: time-of-day conditions do not hold."""
    sticky_tier: Tier | None = None
    conversation: str | None = None
    """The conversation key stickiness uses (a client id, or a hash of the first messages)."""
    time_left_s: float | None = None
    """Seconds from the decision to the request's deadline (the edge reads the clock);
    ``None``: unknown, and deadline spill-over does not apply."""
