"""A request's deadline, computed once at the edge: the planner's deadline spill-over reads the
time it leaves, and the request's job carries it, so both judge the same moment."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.api.meta import RequestMeta
from gateway.settings import QueueSettings

__all__ = ["RequestDeadline", "request_timeout_ms"]


def request_timeout_ms(meta: RequestMeta, queue: QueueSettings) -> int:
    """``x-tiergate-timeout-ms`` (or ``metadata``), else ``queue.default_timeout_ms``; at most
    ``queue.max_timeout_ms``."""
    return min(meta.timeout_ms or queue.default_timeout_ms, queue.max_timeout_ms)


@dataclass(frozen=True, slots=True)
class RequestDeadline:
    timeout_ms: int
    at: float
    """Unix time (s): the request's arrival plus its timeout."""

    @classmethod
    def of(cls, meta: RequestMeta, queue: QueueSettings, received_at: float) -> RequestDeadline:
        timeout_ms = request_timeout_ms(meta, queue)
        return cls(timeout_ms, received_at + timeout_ms / 1000)

    def left_s(self, now: float) -> float:
        """Seconds from ``now`` to the deadline (negative once it has passed)."""
        return self.at - now
