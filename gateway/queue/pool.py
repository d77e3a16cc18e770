"""The replicas of every deployment, and a local least-loaded choice among them.

This first version balances by the in-flight count this process knows; load from vLLM's
``/metrics`` and global capacity shared through Redis come with the queue work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from backends.protocol import Backend

__all__ = ["BackendPool", "Replica"]


@dataclass(slots=True)
class Replica:
    backend: Backend
    capacity: int
    inflight: int = 0

    @property
    def load(self) -> float:
        return self.inflight / self.capacity


class BackendPool:
    def __init__(self, replicas: Mapping[str, Sequence[Replica]]) -> None:
        self._replicas = {name: list(group) for name, group in replicas.items()}

    def capacity(self, deployment: str) -> int:
        return sum(r.capacity for r in self._replicas.get(deployment, ()))

    def __contains__(self, deployment: str) -> bool:
        return deployment in self._replicas

    @asynccontextmanager
    async def lease(self, deployment: str) -> AsyncIterator[Backend]:
        """The least-loaded replica of ``deployment``, counted in flight while leased."""
        group = self._replicas[deployment]
        replica = min(group, key=lambda r: r.load)
        replica.inflight += 1
        try:
            yield replica.backend
        finally:
            replica.inflight -= 1

    async def aclose(self) -> None:
        backends = [r.backend for group in self._replicas.values() for r in group]
        await asyncio.gather(*(b.aclose() for b in backends), return_exceptions=True)
