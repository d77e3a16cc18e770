"""One job's run: what happened while the executor served it.

The executor keeps one ``Run`` per job it serves: every backend call so far (each an ``Attempt``
of the ledger row, with the tokens it is booked), the attempts of the runs before it (a job
taken over from a worker that died or handed it back, ``gateway.queue.ownership.notes``), the time
spent in backends, when the stream's first chunk left, and the deployment that answered. The ledger
entry and the figures the replies carry are built from it (``gateway.queue.billing``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from backends.errors import BackendError
from backends.types import Usage
from gateway.accounting.records import Attempt
from gateway.queue.jobs import Job

__all__ = ["Run"]


@dataclass(slots=True)
class Run:
    """What happened while serving one job."""

    job: Job
    picked_at: float
    reclaimed: bool = False
    """Taken over from a worker that died: it may have sent part of a stream already."""
    local: bool = False
    """The client waits in this process (a job started at once): nothing crosses Redis."""
    attempts: list[Attempt] = field(default_factory=list)
    """This run's calls. The executor's decisions (breakers skipped, the error's message) read
    only these: an earlier run's calls were made by another worker, maybe long ago."""
    carried: tuple[Attempt, ...] = ()
    """The calls of the runs before this one, from their note: booked in this run's row."""
    backend_s: float = 0.0
    attempt_at: float = 0.0
    """When the current backend attempt started (``time.time()``)."""
    ttft_at: float | None = None
    deployment: str | None = None
    downgraded: bool = False
    waited_s: float = 0.0
    """Time spent waiting between retries (``Retry-After``, backoff): neither backend time nor
    the gateway's own overhead."""
    last_error: BackendError | None = None
    """The last failure of this run's calls: the client's error when no deployment answers
    (its status, ``Retry-After`` and the provider's own code)."""
    served_by: list[str] = field(default_factory=list)
    """The deployments whose output reached the client, in order: more than one when a
    stream was continued elsewhere."""

    def booked(self) -> tuple[Attempt, ...]:
        """Every call the job's ledger row books: the earlier runs', then this one's."""
        return (*self.carried, *self.attempts)

    def record(
        self,
        deployment: str,
        outcome: str,
        started: float,
        usage: Usage | None,
        error: str | None,
        estimated: bool = False,
    ) -> None:
        elapsed = max(time.time() - started, 0.0)
        self.backend_s += elapsed
        self.attempts.append(
            Attempt(
                deployment=deployment,
                outcome=outcome,
                latency_ms=elapsed * 1000,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                error=error,
                estimated=estimated,
            )
        )
