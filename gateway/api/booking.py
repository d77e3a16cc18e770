"""Ledger entries for requests the edge answers itself (refused before or instead of a worker).

The 504 of a job that had started (``RunTimedOut``), and any answer the edge gives while it
cannot settle who owns a queued job (Redis failed: ``GatewayError.provisional``), is booked
*provisional*: a run may still book the request, and its entry then replaces this row's
bookkeeping while the row keeps the answer the client got (``gateway.accounting.supersede``).
Every other refusal is final."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.records import LedgerEntry
from gateway.auth.principals import Principal
from gateway.errors import GatewayError
from gateway.observability.logging import log_request
from gateway.parts import Services
from gateway.queue.jobs import Job
from router.plan import RoutePlan

__all__ = ["Refusal", "book_refusal", "observe_refusal", "refusal_entry"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the edge answers with ``error`` and no backend call of its own: what its row
    records besides who sent it."""

    request_id: str
    received_at: float
    """When the edge received it (``time.time()``)."""
    error: GatewayError
    requested_model: str = ""
    plan: RoutePlan | None = None
    stream: bool = False
    endpoint: str = "chat"

    @classmethod
    def of_job(cls, job: Job, error: GatewayError) -> Refusal:
        return cls(
            request_id=job.request_id,
            received_at=job.received_at,
            error=error,
            requested_model=str(job.body.get("model", "")),
            plan=job.plan,
            stream=job.stream,
            endpoint=job.endpoint,
        )


async def book_refusal(services: Services, principal: Principal, refusal: Refusal) -> None:
    entry = refusal_entry(refusal, tenant=principal.tenant or "", principal=principal.name)
    observe_refusal(services, entry, refusal.error, requested_model=refusal.requested_model)
    try:
        await services.ledger_writer.write(entry)
    except (RedisError, SQLAlchemyError, OSError):
        services.metrics.ledger_failures.inc()
        log.error("could not book refused request %s", refusal.request_id)


def observe_refusal(
    services: Services, entry: LedgerEntry, error: GatewayError, *, requested_model: str = ""
) -> None:
    """The metrics, access line and trace of a request the edge answers with ``error``; its
    row is ``entry`` (booked here by ``book_refusal``, or by whoever owns the job)."""
    services.tracing.refused(
        error, tenant=entry.tenant, requested_model=requested_model, stream=entry.stream
    )
    services.metrics.requests.labels(
        entry.tenant, entry.tier or "none", entry.deployment or "none", entry.outcome
    ).inc()
    log_request(
        {
            "request_id": entry.request_id,
            "tenant": entry.tenant,
            "tier": entry.tier or "none",
            "rule": entry.rule,
            "outcome": entry.outcome,
            "status": entry.status_code,
            "stream": entry.stream,
            "latency_ms": round(entry.latency_ms, 3),
            **({"provisional": True} if entry.provisional else {}),
        }
    )


def refusal_entry(refusal: Refusal, *, tenant: str, principal: str) -> LedgerEntry:
    """The row of a request answered with ``refusal.error`` and no backend call of its own."""
    error, plan = refusal.error, refusal.plan
    return LedgerEntry(
        request_id=refusal.request_id,
        tenant=tenant,
        principal=principal,
        created_at=datetime.fromtimestamp(refusal.received_at, UTC),
        outcome=error.outcome,
        status_code=error.status,
        requested_model=refusal.requested_model,
        tier=plan.tier.value if plan else None,
        rule=plan.rule if plan else None,
        score=plan.score if plan else None,
        stream=refusal.stream,
        latency_ms=(time.time() - refusal.received_at) * 1000,
        provisional=error.provisional,
        endpoint=refusal.endpoint,
    )
