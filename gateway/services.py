"""The running service's parts, built once at start-up and closed at shutdown.

``open_services`` is the only place that wires concrete classes together; handlers receive the
finished ``Services`` through the app's state, and tests can build their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Collection
from decimal import Decimal

import aiohttp
from redis.exceptions import RedisError

from gateway.accounting.budget_alerts import BudgetAlerts
from gateway.accounting.budgets import BudgetBook, release_bound_s
from gateway.accounting.dead_letters import DeadLetters
from gateway.accounting.gpu_rates import GpuRates, ReplicaClock
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import PriceBook
from gateway.accounting.rollups import RollupJob
from gateway.accounting.sink import LedgerSink
from gateway.accounting.sweep import ReservationSweep
from gateway.accounting.writer import LedgerWriter
from gateway.auth.changes import AuthChanges
from gateway.auth.directory import TenantDirectory
from gateway.auth.keys import KeyStore
from gateway.auth.runtime import RuntimeAuth
from gateway.auth.store import SqlAuthStore
from gateway.auth.terms import TenantTerms, terms_from_settings
from gateway.coalescer import Coalescer
from gateway.discovery.members import ReplicaDirectory
from gateway.discovery.wiring import FollowReplicas, start_discovery
from gateway.embedded_redis import EmbeddedRedis
from gateway.faults.drain import InflightCalls
from gateway.faults.health import HealthProbe
from gateway.faults.marks import StreamMarks
from gateway.faults.watch import BreakerWatch
from gateway.faults.wiring import (
    make_breaker,
    tier_faults,
    vllm_deployments,
)
from gateway.limits.idempotency import Idempotency
from gateway.limits.rate import RateLimiter
from gateway.metrics import Metrics
from gateway.observability.tracing import Tracing
from gateway.parts import Services
from gateway.queue.billing import Billing
from gateway.queue.client.connection import BLOCKING_READ_S, blocking_client, configured_client
from gateway.queue.edge.deadline import DeadlineAdmission
from gateway.queue.edge.dispatcher import AdmitsEveryStart, Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.edge.snapshot import QueueSnapshot
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.edge_booking import NotedBooking
from gateway.queue.ownership.notes import RunNotes
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.ejection import EjectionPolicy, Ejections
from gateway.queue.replicas.load import LoadScraper
from gateway.queue.replicas.pool import BackendPool
from gateway.queue.replicas.replicas import make_replicas, tier_capacity, vllm_replica
from gateway.queue.running.executor import Executor
from gateway.queue.running.replying import EdgeBeside
from gateway.queue.running.worker import Worker
from gateway.queue.setup import (
    metrics_urls,
    tier_deployments,
    tier_queues,
)
from gateway.rules.score_mix import ScoreMix
from gateway.rules.setup import open_rules
from gateway.settings import Settings
from gateway.tasks import stop_task
from router.aliases import ModelAliases
from router.catalog import Catalog, DeploymentSpec, TenantPolicy
from router.loader import load_serving_classifier

__all__ = ["Services", "build_catalog", "build_policies", "build_terms", "open_services"]

log = logging.getLogger(__name__)

_FALLBACK_THRESHOLD = 0.5
"""For a model file that records no calibrated threshold."""


def build_catalog(
    settings: Settings,
    prices: PriceBook | None = None,
    *,
    kinds: Collection[str] = ("chat",),
) -> Catalog:
    """The deployments of ``kinds``: the chat ones (what the planner chooses from), the
    embedding ones (``router.embeddings``), or both (what a worker runs and bills)."""

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
                capabilities=d.capabilities.of(),
                input_usd_per_token=price(d.model)[0],
                output_usd_per_token=price(d.model)[1],
                accepts_continuation=d.accepts_continuation,
                fallbacks=d.fallbacks,
            )
            for d in settings.deployments
            if d.kind in kinds
        ),
        aliases=ModelAliases.of(settings.aliases),
    )


def build_policies(settings: Settings, default_threshold: float) -> dict[str, TenantPolicy]:
    return {
        name: TenantPolicy(
            tenant=name,
            default_tier=t.default_tier,
            allowed_tiers=frozenset(t.allowed_tiers),
            threshold=default_threshold if t.threshold is None else t.threshold,
            allowed_models=None if t.allowed_models is None else frozenset(t.allowed_models),
            aliases=ModelAliases.of(t.aliases),
        )
        for name, t in settings.tenants.items()
    }


def build_terms(settings: Settings, prices: PriceBook) -> dict[str, TenantTerms]:
    """The config-file tenants' weights, rate limits, budgets and baselines."""
    default_baseline = prices.baseline_model()
    return {name: terms_from_settings(t, default_baseline) for name, t in settings.tenants.items()}


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
        if url is None and settings.redis.mode == "standalone":
            embedded = EmbeddedRedis(data_dir=settings.redis.embedded_dir)
            url = embedded.start()
            stack.callback(embedded.stop)
            supervisor = asyncio.create_task(embedded.supervise(), name="tiergate-embedded-redis")
            stack.push_async_callback(stop_task, supervisor)  # stopped before the server
            log.info("started embedded redis-server at %s (AOF in %s)", url, embedded.data_dir)
        bound = settings.redis.command_timeout_s
        redis = configured_client(
            settings.redis, url, socket_timeout=bound, connect_timeout=bound / 2
        )
        stack.push_async_callback(redis.aclose)
        blocking = blocking_client(settings.redis, url)
        stack.push_async_callback(blocking.aclose)
        redis_keys = RedisKeys(settings.redis.key_prefix)
        coalescer = Coalescer(redis)  # closed before the client, after all its users
        stack.push_async_callback(coalescer.aclose)

        ledger = await SqlLedger.connect(settings.database.url)
        stack.push_async_callback(ledger.aclose)
        auth_store = await SqlAuthStore.connect(settings.database.url)
        stack.push_async_callback(auth_store.aclose)
        prices = PriceBook.from_settings(settings.deployments)
        gpu_rates = GpuRates(redis, redis_keys.prefix, prices.gpu_pools)
        prices.attach_rates(gpu_rates)
        try:  # this period's GPU rates and the next; the writer re-reads them every second
            await prices.ensure_rates()
        except (RedisError, OSError) as exc:
            log.warning("GPU rates not read at start (%s)", type(exc).__name__)
        metrics = Metrics()
        classifier = load_serving_classifier(settings.router.model_path)
        threshold = classifier.threshold or _FALLBACK_THRESHOLD
        directory = TenantDirectory(  # run-time tenants come in with `auth` below
            build_policies(settings, threshold),
            threshold,
            fixed_terms=build_terms(settings, prices),
            default_baseline=prices.baseline_model(),
        )
        alerts = BudgetAlerts(ledger.engine)  # webhooks of budget thresholds crossed
        stack.push_async_callback(alerts.aclose)
        budgets = BudgetBook(
            redis,
            redis_keys.prefix,
            directory.budgets,
            prices=prices,
            metrics=metrics,
            ledger=ledger,  # windows rebuilt from SQL after a Redis loss
            release_after_s=release_bound_s(settings.queue.max_timeout_ms),
            alerts=alerts,
        )
        writer = LedgerWriter(
            redis,
            redis_keys.ledger_events,
            ledger,
            rates=gpu_rates,
            prices=prices,
            budgets=budgets,
            coalescer=coalescer,
            tracing=tracing,
            metrics=metrics,
        )
        catalog = build_catalog(settings, prices)
        every = build_catalog(settings, prices, kinds=("chat", "embedding"))  # runs and bills
        rules = await open_rules(settings, redis, catalog, stack)
        metrics.declare_deployments(d.model for d in settings.deployments)
        auth = RuntimeAuth(
            auth_store,
            AuthChanges(redis, settings.redis.key_prefix),
            on_tenants=directory.replace,
        )
        await auth.start()
        stack.push_async_callback(auth.aclose)
        score_mix = ScoreMix(ledger.engine, lambda: list(directory), settings.router.own_share)
        score_mix.start()
        stack.push_async_callback(score_mix.aclose)
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
        members = ReplicaDirectory(settings)  # vLLM replicas: configured, or discovered pods
        snapshot = QueueSnapshot(redis, redis_keys, tier_queues(settings, redis_keys))
        members.listen(
            lambda _d, _m: snapshot.set_tiers(tier_queues(settings, redis_keys, members.all()))
        )
        await start_discovery(settings, members, stack)
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
        ledger_sink: LedgerSink | None = None
        if workers if sink is None else sink:  # before the workers: it closes after them
            ledger_sink = LedgerSink(
                redis=redis,
                blocking_redis=blocking,
                stream=redis_keys.ledger_events,
                group=redis_keys.ledger_group,
                consumer=f"sink-{edge_id}",
                ledger=ledger,
                dead_letters=DeadLetters(ledger.engine),
                dead_letter_stream=redis_keys.ledger_dead_letters,
                on_dead_letter=metrics.count_dead_letter,
                block_ms=round(BLOCKING_READ_S * 1000),
            )
            ledger_sink.start()
            stack.push_async_callback(ledger_sink.aclose)
            rollups = RollupJob.from_prices(ledger, prices, rates=gpu_rates)
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
            probe: HealthProbe | None = None
            if breaker is not None and fallback.breaker.health_interval_s > 0:
                probe = HealthProbe(
                    session,
                    breaker,
                    {
                        d.model: [m.url for m in members.members(d.model)]
                        for d in vllm_deployments(settings)
                    },
                    interval_s=fallback.breaker.health_interval_s,
                    timeouts_to_drain=fallback.breaker.health_timeouts_to_drain,
                    on_down=inflight.drain,
                )
                probe.start()
                stack.push_async_callback(probe.aclose)
            clock = ReplicaClock(  # the GPU pools' replicas running; their rates kept read
                gpu_rates,
                session,
                {
                    d.model: [m.url for m in members.members(d.model)]
                    if d.provider == "vllm"
                    else [r.url for r in d.replicas]
                    for d in settings.deployments
                },
                refresh=prices.ensure_rates,
            )
            clock.start()
            stack.push_async_callback(clock.aclose)
            replicas = {
                dep.model: make_replicas(
                    dep, session, fallback, members.members(dep.model), redis_keys
                )
                for dep in settings.deployments
            }
            load = LoadScraper(session, metrics_urls(settings, members.all()))
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
                ejections=Ejections(
                    EjectionPolicy(
                        after=fallback.replica_eject_after,
                        base_s=fallback.replica_eject_s,
                        max_s=fallback.replica_eject_max_s,
                    ),
                    on_eject=metrics.count_ejection,
                ),
            )
            pool.start()
            stack.push_async_callback(pool.aclose)
            members.listen(
                FollowReplicas(
                    settings,
                    members,
                    lambda dep, m: vllm_replica(dep, m, session, fallback, redis_keys),
                    pool,
                    load,
                    probe,
                    clock,
                )
            )
            executor = Executor(
                pool,
                prices,
                every,
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
                capacity=tier_capacity(settings),
                worker_id=f"w-{edge_id}",
                claim_ttl_s=claim_ttl,
                pool=pool,
                tiers=tier_deployments(settings),
                batch_headroom=settings.queue.batch_headroom,
                answers=idempotency,
                weights=directory.weights,
                coalescer=coalescer,
                tracing=tracing,
                local_edge=EdgeBeside(edge_id, replies),
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
                redis, redis_keys, Billing(prices, every, directory.baselines), writer
            ),
            deadline=(
                DeadlineAdmission(
                    snapshot.view,
                    margin=settings.queue.deadline_margin,
                    min_waiting=settings.queue.deadline_min_waiting,
                )
                if settings.queue.deadline_admission
                else AdmitsEveryStart()
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
            ledger_sink=ledger_sink,
            score_mix=score_mix,
            embeddings=build_catalog(settings, prices, kinds=("embedding",)),
        )
