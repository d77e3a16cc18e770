"""Every Redis key tiergate uses, in one place.

Keys carry a hash tag (``{…}``) so that a Redis Cluster keeps the keys one operation touches in
one slot. ``prefix`` isolates deployments (and tests) sharing one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RedisKeys"]


@dataclass(frozen=True, slots=True)
class RedisKeys:
    prefix: str = "tg"

    def jobs(self, tier: str) -> str:
        """Stream of queued jobs for one tier (consumer group ``workers``)."""
        return f"{self.prefix}:{{q:{tier}}}:jobs"

    group: str = "workers"

    def replies(self, edge_id: str) -> str:
        """Stream of results and chunks for every in-flight request of one edge process."""
        return f"{self.prefix}:{{e:{edge_id}}}:replies"

    def claim(self, request_id: str) -> str:
        """Who owns a request's outcome: the worker that started it, or the edge that gave up."""
        return f"{self.prefix}:claim:{request_id}"

    @property
    def ledger_events(self) -> str:
        """Stream of ledger entries, written to SQL by the sink (consumer group ``ledger``)."""
        return f"{self.prefix}:{{ledger}}:events"

    ledger_group: str = "ledger"

    def worker_heartbeat(self, worker_id: str) -> str:
        return f"{self.prefix}:workers:{worker_id}"

    @property
    def worker_pattern(self) -> str:
        return f"{self.prefix}:workers:*"
