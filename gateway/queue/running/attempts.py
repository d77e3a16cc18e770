"""Every backend call of a run, accounted for where each part of the gateway looks for it.

One call (or one deployment skipped because its circuit breaker is open) is:

- an ``Attempt`` of the run's ledger row (``Run.record``), with the tokens it is booked;
- a ``backend.attempt`` span (``gateway.observability.tracing``), when tracing is on, whose
  kind says why it happened: ``first``, a ``retry`` on the same deployment, a ``fallback`` to
  the next, or a ``continuation`` of a stream that broke, and whether its tokens are
  estimated;
- one count in the attempts metric, by deployment and outcome, once its row is booked
  (``gateway.accounting.writer``);
- one outcome for the deployment's circuit breaker (``gateway.faults.breaker``): successes, and
  the retryable failures the backend caused (a rejected request is the request's fault, not the
  deployment's; so is a timeout that the request's own deadline cut short:
  ``gateway.queue.running.caller.cut_by_deadline``);
- the same verdict for the replica that served it, whose failures in a row eject it from the
  pool for a while (``gateway.queue.replicas.ejection``); a call that ended with no verdict
  (cancelled, the request's fault) is told too, so a replica's trial call is not lost. A
  failure that ejection answers for (other replicas are usable) is not told to the breaker:
  one bad pod is ejected, it does not open its whole deployment;
- where it leaves the common path (it failed, it goes to a hosted API, the job is handed back),
  the run's note in Redis (``gateway.queue.ownership.notes``), which a run that takes the job over
  books.
"""

from __future__ import annotations

import time

from backends.errors import BackendError
from backends.types import Usage
from gateway.faults.breaker import BreakerState, RedisBreaker
from gateway.observability.tracing import Tracing
from gateway.queue.ownership.notes import CallNotes, InFlight
from gateway.queue.replicas.pool import BackendPool
from gateway.queue.run import Run
from router.catalog import Catalog

__all__ = ["Attempts", "provider_of"]


def provider_of(catalog: Catalog, deployment: str | None) -> str:
    """The provider ``deployment`` is called through (``unknown`` when not in the catalog)."""
    spec = catalog.get(deployment) if deployment else None
    return spec.provider if spec else "unknown"


class Attempts:
    """Books a run's backend calls: in its ledger row, as spans, to breakers."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        breaker: RedisBreaker | None,
        tracing: Tracing,
        notes: CallNotes,
        pool: BackendPool | None = None,
    ) -> None:
        """``pool``: told each call's verdict per replica (``None``: not told)."""
        self._catalog = catalog
        self._pool = pool
        self._breaker = breaker
        self._tracing = tracing
        self._notes = notes

    async def allowed(self, run: Run, deployment: str) -> bool:
        """Whether ``deployment``'s breaker lets a call through; a skip is an attempt
        (``circuit_open``)."""
        if self._breaker is None or await self._breaker.allow(deployment):
            return True
        self.record(run, deployment, "circuit_open", time.time(), None, "circuit breaker open")
        return False

    async def failed(
        self,
        run: Run,
        deployment: str,
        exc: BackendError,
        started: float,
        usage: Usage | None,
        *,
        server: str | None = None,
        resumed: bool = False,
        estimated: bool = False,
        backend_fault: bool = True,
        replica: str | None = None,
    ) -> bool:
        """Record a failed call, and note it (a retry, the next deployment or the error
        follows: slower than the note's round trip); whether the deployment's breaker is open
        now. ``backend_fault`` off: the request, not the backend, ended the call (its own
        deadline); the breaker is not told. ``replica``: the backend name of the replica that
        failed (``None``: none was leased), told the same verdict."""
        self.record(
            run, deployment, exc.kind, started, usage, str(exc),
            server=server, resumed=resumed, estimated=estimated,
        )  # fmt: skip
        run.last_error = exc
        backend_caused = exc.retryable and backend_fault
        breaker_judges = backend_caused
        if replica is not None and self._pool is not None:
            if backend_caused:
                breaker_judges = self._pool.replica_failed(deployment, replica)
            else:
                self._pool.replica_no_verdict(deployment, replica)
        await self._notes.save(run)
        if self._breaker is None or not breaker_judges:
            return False
        return await self._breaker.record(deployment, ok=False) is BreakerState.OPEN

    def unjudged(self, deployment: str, replica: str | None) -> None:
        """A call on ``replica`` ended with no verdict on it (cancelled)."""
        if replica is not None and self._pool is not None:
            self._pool.replica_no_verdict(deployment, replica)

    def record(
        self,
        run: Run,
        deployment: str,
        outcome: str,
        started: float,
        usage: Usage | None,
        error: str | None,
        *,
        server: str | None = None,
        resumed: bool = False,
        estimated: bool = False,
    ) -> None:
        """One attempt: in the ledger row, and as a ``backend.attempt`` span. Its kind says
        why it happened: ``first``, a ``retry`` on the same deployment, a ``fallback`` to the
        next, or a ``continuation`` of a stream that broke; ``reason``: the previous outcome.
        ``estimated``: ``usage`` is the gateway's estimate (``gateway.accounting.estimates``)."""
        previous = run.attempts[-1] if run.attempts else None
        run.record(deployment, outcome, started, usage, error, estimated)
        if not self._tracing.enabled:
            return
        if resumed:
            kind = "continuation"
        elif previous is None:
            kind = "first"
        else:
            kind = "retry" if previous.deployment == deployment else "fallback"
        self._tracing.attempt(
            deployment=deployment,
            provider=provider_of(self._catalog, deployment),
            number=len(run.attempts),
            kind=kind,
            reason=previous.outcome if previous is not None else None,
            outcome=outcome,
            started=started,
            ended=time.time(),
            server=server,
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            estimated=estimated,
        )

    async def calling(self, run: Run, deployment: str, started: float) -> None:
        """A call to a hosted API is about to be sent: note it in flight first, since from then
        on its provider bills it, whatever becomes of this worker."""
        await self._notes.save(run, InFlight(deployment, started))

    async def handed_back(self, run: Run) -> None:
        """The worker hands the job back at shutdown (its calls are recorded, the interrupted
        one as cancelled): note them for the worker that takes the job over."""
        if run.attempts:
            await self._notes.save(run)

    async def succeeded(self, deployment: str, replica: str | None = None) -> None:
        """Tell the breaker of ``deployment`` (and ``replica``'s ejection) that a call
        answered."""
        if replica is not None and self._pool is not None:
            self._pool.replica_answered(deployment, replica)
        if self._breaker is not None:
            await self._breaker.record(deployment, ok=True)
