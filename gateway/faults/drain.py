"""In-flight calls to a drained deployment end at once, so they are retried elsewhere.

A deployment whose replicas all fail their health checks (a spot GPU being reclaimed) is drained:
its breaker opens, so no new work goes to it (``gateway/faults/health.py``). The calls already
waiting on it would otherwise hold their slots until their attempt timeout; the executor runs
each non-streamed call inside ``InflightCalls.watching(deployment)``, and ``drain(deployment)``
ends them: the call is cancelled (the HTTP request aborted, as vLLM expects of a client that
leaves) and raises ``BackendUnavailable``, retryable, so the executor moves on along the plan.

Streams are not cut here: one that has not sent its first token fails its first-token timeout
and falls back freely, one that has continues on the next deployment after its stall timeout
(docs/fallback.md). Cutting a stream while a chunk is on its way to the edge could lose or
repeat that chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from backends.errors import BackendUnavailable

__all__ = ["InflightCalls"]


class InflightCalls:
    def __init__(self) -> None:
        self._scopes: dict[str, set[asyncio.Timeout]] = {}
        """Deployment -> the timeout scopes (no deadline) of the calls waiting on it."""

    @contextlib.asynccontextmanager
    async def watching(self, deployment: str) -> AsyncIterator[None]:
        """Run a call to ``deployment``; ``BackendUnavailable`` if the deployment is drained
        meanwhile."""
        scopes = self._scopes.setdefault(deployment, set())
        scope = asyncio.timeout(None)
        try:
            async with scope:
                scopes.add(scope)
                try:
                    yield
                finally:
                    scopes.discard(scope)
        except TimeoutError:
            if not scope.expired():  # the call's own timeout, not a drain
                raise
            raise BackendUnavailable(
                "the deployment failed its health checks while the call waited",
                backend=deployment,
            ) from None

    def drain(self, deployment: str) -> int:
        """End every call waiting on ``deployment``; how many there were."""
        scopes = [s for s in self._scopes.get(deployment, ()) if not s.expired()]
        now = asyncio.get_running_loop().time()
        for scope in scopes:
            scope.reschedule(now)
        return len(scopes)
