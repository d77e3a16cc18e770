"""The running service's parts, built once at start-up and closed at shutdown.

``open_services`` is the only place that wires concrete classes together; handlers receive the
finished ``Services`` through the app's state, and tests can build their own.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

import aiohttp
import redis.asyncio as aioredis

from backends.protocol import Backend
from gateway.accounting.budgets import BudgetBook, release_bound_s
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import PriceBook
from gateway.accounting.rollups import RollupJob
from gateway.accounting.sink import LedgerSink
from gateway.accounting.sweep import ReservationSweep
from gateway.accounting.throughput import ThroughputMeter
from gateway.accounting.writer import LedgerWriter
from gateway.auth.changes import AuthChanges
from gateway.auth.directory import TenantDirectory
from gateway.auth.keys import KeyStore
from gateway.auth.runtime import RuntimeAuth
from gateway.auth.store import SqlAuthStore
from gateway.auth.terms import TenantTerms, terms_from_settings
from gateway.coalescer import Coalescer
from gateway.embedded_redis import EmbeddedRedis
from gateway.faults.breaker import RedisBreaker
from gateway.faults.drain import InflightCalls
from gateway.faults.health import HealthProbe
from gateway.faults.marks import StreamMarks
from gateway.faults.watch import BreakerWatch
from gateway.faults.wiring import (
    backend_timeouts,
    make_breaker,
    tier_faults,
    vllm_deployments,
)
from gateway.limits.idempotency import Idempotency
from gateway.limits.rate import RateLimiter
from gateway.metrics import Metrics
from gateway.observability.tracing import Tracing
from gateway.queue.billing import Billing
from gateway.queue.capacity import SlotLeases
from gateway.queue.connection import redis_client
from gateway.queue.deadline import DeadlineAdmission
from gateway.queue.dispatcher import Dispatcher
from gateway.queue.executor import Executor
from gateway.queue.keys import RedisKeys
from gateway.queue.load import LoadScraper
from gateway.queue.noted import NotedBooking
from gateway.queue.notes import RunNotes
from gateway.queue.pool import BackendPool, Replica
from gateway.queue.replies import ReplyRouter
from gateway.queue.setup import (
    assign_slots,
    metrics_urls,
    tier_deployments,
    tier_queues,
)
from gateway.queue.snapshot import QueueSnapshot
from gateway.queue.worker import Worker
from gateway.rules.edge import RulesRuntime
from gateway.rules.setup import open_rules
from gateway.settings import DeploymentSettings, FallbackSettings, Settings, read_secret
from router.catalog import Catalog, DeploymentSpec, TenantPolicy
from router.classifier import Classifier
from router.loader import load_serving_classifier

__all__ = ["Services", "build_catalog", "build_policies", "build_terms", "open_services"]

log = logging.getLogger(__name__)

_FALLBACK_THRESHOLD = 0.5
"""For a model file that records no calibrated threshold."""


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
    classifier: Classifier | None
    dispatcher: Dispatcher
    replies: ReplyRouter
    metrics: Metrics
    worker: Worker | None
    edge_id: str
    auth: RuntimeAuth | None = None
    """Run-time tenants and keys (SQL, cached here); ``None`` in tests that build their own."""
    queue_snapshot: QueueSnapshot | None = None
    """Cached queue state (expected waits, depths, in-flight), refreshed in the background."""
    rate_limits: RateLimiter | None = None
    """Per-tenant requests/tokens per minute (Redis); ``None`` in tests that build their own."""
    breaker: RedisBreaker | None = None
    """Circuit breakers shared through Redis (``None``: disabled in config)."""
    breaker_watch: BreakerWatch | None = None
    """Which breakers are open, refreshed every second: ``open_now`` feeds
    ``Signals.unavailable``."""
    rules: RulesRuntime | None = None
    """Routing rules (SQL versions, hot reload) and sticky conversations (docs/rules.md)."""
    budgets: BudgetBook | None = None
    """Tenant budgets: reservations before a request runs, settled by the ledger writer."""
    tracing: Tracing = field(default_factory=Tracing.off)
    """OpenTelemetry traces of this service (``Tracing.off()`` unless ``tracing.enabled``)."""


def build_catalog(settings: Settings, prices: PriceBook | None = None) -> Catalog:
    def price(model: str) -> tuple[Decimal | None, Decimal | None]:
        known = prices.price_of(model) if prices is not None else None
        return (None, None) if known is None else (known.input_per_token, known.output_per_token)

    return Catalog(
        tuple(
            DeploymentSpec(
                model=d.model,
                tier=d.tier,
                max_model_len=d.max_model_len,
                provider=d.provider,
                input_usd_per_token=price(d.model)[0],
                output_usd_per_token=price(d.model)[1],
            )
            for d in settings.deployments
        )
    )


def build_policies(settings: Settings, default_threshold: float) -> dict[str, TenantPolicy]:
    return {
        name: TenantPolicy(
            tenant=name,
            default_tier=t.default_tier,
            allowed_tiers=frozenset(t.allowed_tiers),
            threshold=default_threshold if t.threshold is None else t.threshold,
            allowed_models=None if t.allowed_models is None else frozenset(t.allowed_models),
        )
        for name, t in settings.tenants.items()
    }


def build_terms(settings: Settings, prices: PriceBook) -> dict[str, TenantTerms]:
    """The config-file tenants' weights, rate limits, budgets and baselines."""
    default_baseline = prices.baseline_model()
    return {name: terms_from_settings(t, default_baseline) for name, t in settings.tenants.items()}


def _make_backends(
    dep: DeploymentSettings, session: aiohttp.ClientSession, fallback: FallbackSettings
) -> list[Replica]:
    api_key = read_secret(dep.api_key_env) if dep.api_key_env else None
    timeouts = backend_timeouts(fallback, dep)
    replicas: list[Replica] = []
    if dep.provider == "vllm":
        from backends.openai_http import VLLMBackend

        for i, rep in enumerate(dep.replicas):
            backend: Backend = VLLMBackend(
                name=f"{dep.model}#{i}",
                base_url=rep.url,
                session=session,
                api_key=api_key,
                **timeouts,
            )
            replicas.append(Replica(backend, rep.max_num_seqs))
    else:
        from backends.litellm_backend import LiteLLMBackend

        api_base = dep.replicas[0].url if dep.replicas else None
        capacity = dep.replicas[0].max_num_seqs if dep.replicas else 64
        backend = LiteLLMBackend(
            name=dep.model,
            litellm_model=dep.litellm_model or dep.model,
            api_base=api_base,
            api_key=api_key or ("sk-unused-local" if api_base else None),
            session=session,
            **timeouts,
        )
        replicas.append(Replica(backend, capacity))
    return replicas


def _tier_capacity(settings: Settings) -> dict[str, int]:
    capacity: dict[str, int] = {}
    for dep in settings.deployments:
        slots = sum(r.max_num_seqs for r in dep.replicas) or 64
        capacity[dep.tier.value] = capacity.get(dep.tier.value, 0) + slots
    return capacity


@contextlib.asynccontextmanager
async def open_services(
    settings: Settings,
    *,
    dev: bool = False,
    workers: bool = True,
    sink: bool | None = None,
    tracing: Tracing | None = None,
) -> AsyncIterator[Services]:
    """Build every service; close them all, in reverse order, on exit. ``sink``: run the
    ledger sink and the daily rollups here (default: where the workers run). ``tracing``: the
    caller's own (tests); by default one is built from ``settings.tracing`` and flushed last."""
    async with contextlib.AsyncExitStack() as stack:
        edge_id = secrets.token_hex(8)
        if tracing is None:
            tracing = Tracing.from_settings(settings.tracing, instance_id=edge_id)
            stack.push_async_callback(tracing.aclose)  # after everything that makes spans
        keys = KeyStore.from_settings(settings, dev=dev)
        url = settings.redis.url
        if url is None:
            embedded = EmbeddedRedis()
            url = embedded.start()
            stack.callback(embedded.stop)
            log.info("started embedded redis-server at %s", url)
        bound = settings.redis.command_timeout_s
        redis = redis_client(url, socket_timeout=bound, connect_timeout=bound / 2)
        stack.push_async_callback(redis.aclose)
        blocking = redis_client(url, socket_timeout=5.0)
        stack.push_async_callback(blocking.aclose)
        redis_keys = RedisKeys(settings.redis.key_prefix)
        coalescer = Coalescer(redis)  # closed before the client, after all its users
        stack.push_async_callback(coalescer.aclose)

        ledger = await SqlLedger.connect(settings.database.url)
        stack.push_async_callback(ledger.aclose)
        auth_store = await SqlAuthStore.connect(settings.database.url)
        stack.push_async_callback(auth_store.aclose)
        prices = PriceBook.from_settings(settings.deployments)
        metrics = Metrics()
        classifier = load_serving_classifier(settings.router.model_path)
        threshold = classifier.threshold or _FALLBACK_THRESHOLD
        directory = TenantDirectory(  # run-time tenants come in with `auth` below
            build_policies(settings, threshold),
            threshold,
            fixed_terms=build_terms(settings, prices),
            default_baseline=prices.baseline_model(),
        )
        budgets = BudgetBook(
            redis,
            redis_keys.prefix,
            directory.budgets,
            prices=prices,
            metrics=metrics,
            ledger=ledger,  # windows rebuilt from SQL after a Redis loss
            release_after_s=release_bound_s(settings.queue.max_timeout_ms),
        )
        writer = LedgerWriter(
            redis,
            redis_keys.ledger_events,
            ledger,
            meter=ThroughputMeter(redis, redis_keys.prefix),
            prices=prices,
            budgets=budgets,
            coalescer=coalescer,
            tracing=tracing,
        )
        catalog = build_catalog(settings, prices)
        rules = await open_rules(settings, redis, catalog, stack)
        metrics.declare_deployments(d.model for d in settings.deployments)
        auth = RuntimeAuth(
            auth_store,
            AuthChanges(redis, settings.redis.key_prefix),
            on_tenants=directory.replace,
        )
        await auth.start()
        stack.push_async_callback(auth.aclose)
        # In every process, whatever it runs: one of them releases unsettled reservations.
        sweep = ReservationSweep(redis, budgets, owner=edge_id)
        sweep.start()  # after the run-time tenants are in: it sweeps theirs too
        stack.push_async_callback(sweep.aclose)
        keys = keys.with_runtime(auth)

        replies = ReplyRouter(blocking, redis_keys.replies(edge_id))
        replies.start()
        stack.push_async_callback(replies.aclose)
        claim_ttl = max(settings.queue.result_ttl_s, 60)
        idempotency = Idempotency(  # keys lost with Redis are looked up in the ledger
            redis, settings.redis.key_prefix, ttl_s=claim_ttl, ledger=ledger
        )
        snapshot = QueueSnapshot(redis, redis_keys, tier_queues(settings, redis_keys))
        snapshot.start()
        stack.push_async_callback(snapshot.aclose)
        breaker = make_breaker(
            settings.fallback, redis, settings.redis.key_prefix, metrics.set_breaker
        )
        breaker_watch: BreakerWatch | None = None
        if breaker is not None:
            deployments = [d.model for d in settings.deployments]
            breaker_watch = BreakerWatch(breaker, deployments, set_state=metrics.set_breaker)
            breaker_watch.start()
            stack.push_async_callback(breaker_watch.aclose)
        if workers if sink is None else sink:  # before the workers: it closes after them
            ledger_sink = LedgerSink(
                redis=redis,
                blocking_redis=blocking,
                stream=redis_keys.ledger_events,
                group=redis_keys.ledger_group,
                consumer=f"sink-{edge_id}",
                ledger=ledger,
            )
            ledger_sink.start()
            stack.push_async_callback(ledger_sink.aclose)
            rollups = RollupJob.from_prices(ledger, prices)
            rollups.start()
            stack.push_async_callback(rollups.aclose)
        worker: Worker | None = None
        if workers:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                skip_auto_headers=("User-Agent",),
            )
            stack.push_async_callback(session.close)
            fallback = settings.fallback
            inflight = InflightCalls()
            if breaker is not None and fallback.breaker.health_interval_s > 0:
                probe = HealthProbe(
                    session,
                    breaker,
                    {d.model: [r.url for r in d.replicas] for d in vllm_deployments(settings)},
                    interval_s=fallback.breaker.health_interval_s,
                    timeouts_to_drain=fallback.breaker.health_timeouts_to_drain,
                    on_down=inflight.drain,
                )
                probe.start()
                stack.push_async_callback(probe.aclose)
            replicas = {
                dep.model: _make_backends(dep, session, fallback) for dep in settings.deployments
            }
            assign_slots(replicas, settings, redis_keys)
            load = LoadScraper(session, metrics_urls(settings))
            load.start()
            stack.push_async_callback(load.aclose)
            pool = BackendPool(
                replicas,
                leases=SlotLeases(
                    redis, lease_ms=int(settings.queue.slot_lease_s * 1000), coalescer=coalescer
                ),
                owner=f"w-{edge_id}",
                chooser=load.rank,
                affinity=settings.queue.affinity,
            )
            pool.start()
            stack.push_async_callback(pool.aclose)
            executor = Executor(
                pool,
                prices,
                catalog,
                directory.baselines,
                breaker=breaker,
                faults=tier_faults(settings.fallback),
                continuation=settings.fallback.continuation,
                stream_marks=StreamMarks(redis, settings.redis.key_prefix, coalescer=coalescer),
                run_notes=RunNotes(redis, redis_keys, keep_s=claim_ttl),
                inflight=inflight,
                tracing=tracing,
            )
            worker = Worker(
                redis=redis,
                blocking_redis=blocking,
                keys=redis_keys,
                executor=executor,
                ledger=writer,
                capacity=_tier_capacity(settings),
                worker_id=f"w-{edge_id}",
                claim_ttl_s=claim_ttl,
                pool=pool,
                tiers=tier_deployments(settings),
                batch_headroom=settings.queue.batch_headroom,
                idempotency=idempotency,
                weights=directory.weights,
                coalescer=coalescer,
                tracing=tracing,
                local_edge=(edge_id, replies),
            )
            worker.start()
            stack.push_async_callback(worker.aclose)
        dispatcher = Dispatcher(
            redis,
            redis_keys,
            replies,
            max_depth=settings.queue.max_depth,
            claim_ttl_s=claim_ttl,
            tier_max_depth=settings.queue.tier_max_depth,
            weights=directory.weights,
            expected_wait=snapshot.expected_wait,
            idempotency=idempotency,
            local=worker if settings.queue.direct_start else None,
            noted=NotedBooking(
                redis, redis_keys, Billing(prices, catalog, directory.baselines), writer
            ),
            deadline=(
                DeadlineAdmission(
                    snapshot.view,
                    margin=settings.queue.deadline_margin,
                    min_waiting=settings.queue.deadline_min_waiting,
                )
                if settings.queue.deadline_admission
                else None
            ),
        )

        yield Services(
            settings=settings,
            keys=keys,
            redis=redis,
            redis_keys=redis_keys,
            ledger=ledger,
            ledger_writer=writer,
            prices=prices,
            catalog=catalog,
            policies=directory,
            classifier=classifier,
            dispatcher=dispatcher,
            replies=replies,
            metrics=metrics,
            worker=worker,
            edge_id=edge_id,
            auth=auth,
            queue_snapshot=snapshot,
            rate_limits=RateLimiter(
                redis, settings.redis.key_prefix, directory.rates, ledger=ledger
            ),  # buckets rebuilt from SQL after a Redis loss
            breaker=breaker,
            breaker_watch=breaker_watch,
            rules=rules,
            budgets=budgets,
            tracing=tracing,
        )
