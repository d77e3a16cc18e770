"""The running service's parts (``Services``): what handlers, the CLI and tests receive.

Every part is required: a part is ``None`` only where that means something in production (no
worker, no sink, or breakers off in config), never because a test left it out. Only the type
lives here; ``gateway.services.open_services`` builds and closes the parts (the one place that
wires concrete classes together), so a handler depends on the parts it uses and not on how they
are made (``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis

from gateway.accounting.budgets import BudgetBook
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import PriceBook
from gateway.accounting.sink import LedgerSink
from gateway.accounting.writer import LedgerWriter
from gateway.auth.keys import KeyStore
from gateway.auth.runtime import RuntimeAuth
from gateway.faults.breaker import RedisBreaker
from gateway.faults.watch import BreakerWatch
from gateway.limits.rate import RateLimiter
from gateway.metrics import Metrics
from gateway.observability.tracing import Tracing
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.edge.snapshot import QueueSnapshot
from gateway.queue.keys import RedisKeys
from gateway.queue.running.worker import Worker
from gateway.rules.edge import RulesRuntime
from gateway.rules.score_mix import ScoreMix
from gateway.settings import Settings
from router.catalog import Catalog, TenantPolicy
from router.classifier import Classifier

__all__ = ["Services"]


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    keys: KeyStore
    redis: aioredis.Redis
    redis_keys: RedisKeys
    ledger: SqlLedger
    ledger_writer: LedgerWriter
    prices: PriceBook
    catalog: Catalog
    policies: Mapping[str, TenantPolicy]
    classifier: Classifier
    dispatcher: Dispatcher
    replies: ReplyRouter
    metrics: Metrics
    worker: Worker | None
    """This process's worker; ``None``: it runs none (``serve --no-workers``, an edge only)."""
    edge_id: str
    auth: RuntimeAuth
    """Run-time tenants and keys (SQL, cached here)."""
    queue_snapshot: QueueSnapshot
    """Cached queue state (expected waits, depths, in-flight), refreshed in the background."""
    rate_limits: RateLimiter
    """Per-tenant requests/tokens per minute (Redis); a tenant with no limits is never
    refused."""
    rules: RulesRuntime
    """Routing rules (SQL versions, hot reload) and sticky conversations (docs/rules.md)."""
    budgets: BudgetBook
    """Tenant budgets: reservations before a request runs, settled by the ledger writer (a
    tenant with no budgets reserves nothing)."""
    score_mix: ScoreMix
    """Each tenant's recent classifier scores (``Signals.own_scores``), refreshed from SQL."""
    breaker: RedisBreaker | None
    """Circuit breakers shared through Redis (``None``: disabled in config)."""
    breaker_watch: BreakerWatch | None
    """Which breakers are open, refreshed every second: ``open_now`` feeds
    ``Signals.unavailable`` (``None``: breakers disabled in config)."""
    tracing: Tracing
    """OpenTelemetry traces of this service (``Tracing.off()`` unless ``tracing.enabled``)."""
    ledger_sink: LedgerSink | None
    """The ledger sink, in a process that runs one (its ``state`` is shown by ``/readyz``);
    ``None``: this process runs none (an edge only, or ``worker --no-sink``)."""
    embeddings: Catalog
    """The embedding deployments (``router.embeddings``); ``catalog`` has the chat ones."""
