"""Ledger entries for requests the edge answers itself (refused before or instead of a worker).

The 504 of a job that had started (``RunTimedOut``), and any answer the edge gives while it
cannot settle who owns a queued job (Redis failed: ``GatewayError.provisional``), is booked
*provisional*: a run may still book the request, and its entry then replaces this row's
bookkeeping while the row keeps the answer the client got (``gateway.accounting.supersede``).
Every other refusal is final."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.records import LedgerEntry
from gateway.auth.principals import Principal
from gateway.errors import GatewayError
from gateway.observability.logging import log_request
from gateway.parts import Services
from router.plan import RoutePlan

__all__ = ["book_refusal", "observe_refusal", "refusal_entry"]

log = logging.getLogger(__name__)


async def book_refusal(
    services: Services,
    *,
    request_id: str,
    principal: Principal,
    received_at: float,
    error: GatewayError,
    requested_model: str = "",
    plan: RoutePlan | None = None,
    stream: bool = False,
    endpoint: str = "chat",
) -> None:
    entry = refusal_entry(
        request_id=request_id,
        tenant=principal.tenant or "",
        principal=principal.name,
        received_at=received_at,
        error=error,
        requested_model=requested_model,
        plan=plan,
        stream=stream,
        endpoint=endpoint,
    )
    observe_refusal(services, entry, error, requested_model=requested_model)
    try:
        await services.ledger_writer.write(entry)
    except (RedisError, SQLAlchemyError, OSError):
        services.metrics.ledger_failures.inc()
        log.error("could not book refused request %s", request_id)


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


def refusal_entry(
    *,
    request_id: str,
    tenant: str,
    principal: str,
    received_at: float,
    error: GatewayError,
    requested_model: str = "",
    plan: RoutePlan | None = None,
    stream: bool = False,
    endpoint: str = "chat",
) -> LedgerEntry:
    """The row of a request answered with ``error`` and no backend call of its own."""
    return LedgerEntry(
        request_id=request_id,
        tenant=tenant,
        principal=principal,
        created_at=datetime.fromtimestamp(received_at, UTC),
        outcome=error.outcome,
        status_code=error.status,
        requested_model=requested_model,
        tier=plan.tier.value if plan else None,
        rule=plan.rule if plan else None,
        score=plan.score if plan else None,
        stream=stream,
        latency_ms=(time.time() - received_at) * 1000,
        provisional=error.provisional,
        endpoint=endpoint,
    )
