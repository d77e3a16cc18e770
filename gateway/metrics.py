"""tiergate's Prometheus metrics, on a registry of their own (never the process-global one).

Every name starts with ``tiergate_`` (vLLM's own metrics keep ``vllm:``). Counters appear with a
``_total`` suffix in the exposition. ``docs/observability.md`` lists each metric with its labels;
``deploy/monitoring/`` builds rules and the dashboard on them, and
``tests/e2e/test_metrics_names.py`` checks that every name used there is exported.

Where the data is observed: the edge (``gateway/api/relay.py``, ``gateway/api/edge.py``) records
requests, latency, TTFT, inter-token gaps, overhead, route decisions, fallbacks, tokens and cost;
the ledger writer calls ``observe_attempts`` with every entry it books (each backend call
counted once, where its row is booked: a worker, or the edge); the admin app refreshes
queue depth on every scrape.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["BREAKER_STATES", "Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

BREAKER_STATES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}
"""Values of ``tiergate_breaker_state``."""


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tiergate_requests",
            "Requests answered, by tenant, tier, deployment and outcome (ok or error code)",
            ["tenant", "tier", "deployment", "outcome"],
            registry=r,
        )
        self.unauthenticated = Counter(
            "tiergate_unauthenticated_requests",
            "Requests refused before a principal was known (no ledger row)",
            ["reason"],
            registry=r,
        )
        self.latency = Histogram(
            "tiergate_request_duration_seconds",
            "End-to-end request time at the edge (to the last byte of the answer)",
            ["tier", "deployment", "stream"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "tiergate_time_to_first_token_seconds",
            "Streams: time from request arrival at the edge to its first chunk (queue included)",
            ["tier", "deployment"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tiergate_inter_token_latency_seconds",
            "Streams: gap between successive chunks as the edge relays them",
            ["tier", "deployment"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "tiergate_overhead_seconds",
            "Time spent in tiergate itself (excluding queue wait and backend time)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.route_time = Histogram(
            "tiergate_route_decision_seconds",
            "Time in the router's decide (classifier scoring and planner) per request",
            ["scored"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.classifier_score = Histogram(
            "tiergate_classifier_score",
            "Classifier complexity scores of routed requests (0: easy, 1: needs the large tier)",
            ["tenant"],
            buckets=_SCORE_BUCKETS,
            registry=r,
        )
        self.route_decisions = Counter(
            "tiergate_route_decisions",
            "Route plans made, by tenant, first tier and the rule that decided",
            ["tenant", "tier", "rule"],
            registry=r,
        )
        self.fallbacks = Counter(
            "tiergate_fallbacks",
            "Requests answered by another deployment than the plan's first",
            ["tier", "planned", "served"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "tiergate_queue_wait_seconds",
            "Time a job waited in Redis before a worker took it",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "tiergate_tokens",
            "Tokens billed, by tenant, tier and kind (prompt or completion)",
            ["tenant", "tier", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "tiergate_cost_usd",
            "Cost booked, in USD, by tenant, tier and deployment (priced requests only)",
            ["tenant", "tier", "deployment"],
            registry=r,
        )
        self.attempts = Counter(
            "tiergate_backend_attempts",
            "Backend calls, by deployment and outcome",
            ["deployment", "outcome"],
            registry=r,
        )
        self.unknown_price = Counter(
            "tiergate_unknown_price_requests",
            "Answered requests booked without a known price (flagged in the ledger)",
            ["tenant", "deployment"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "tiergate_queue_depth", "Jobs waiting in a tier's stream", ["tier"], registry=r
        )
        # Queue signals for autoscaling (KEDA / Prometheus scalers), from the queue snapshot.
        self.queue_lane_depth = Gauge(
            "tiergate_queue_lane_depth",
            "Jobs waiting per tier and priority lane",
            ["tier", "lane"],
            registry=r,
        )
        self.queue_oldest_age = Gauge(
            "tiergate_queue_oldest_job_age_seconds",
            "Age of the oldest job no worker has taken yet, per tier and lane",
            ["tier", "lane"],
            registry=r,
        )
        self.queue_expected_wait = Gauge(
            "tiergate_queue_expected_wait_seconds",
            "Expected wait of a new job per tier (what spill-over reads)",
            ["tier"],
            registry=r,
        )
        self.inflight = Gauge(
            "tiergate_inflight_requests",
            "Requests in flight per deployment across every process (held slot leases)",
            ["deployment"],
            registry=r,
        )
        self.capacity_slots = Gauge(
            "tiergate_capacity_slots",
            "Slots per deployment (replicas' max_num_seqs summed)",
            ["deployment"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "tiergate_breaker_state",
            "Circuit breaker per deployment: 0 closed, 1 half-open, 2 open",
            ["deployment"],
            registry=r,
        )
        self.replica_ejections = Counter(
            "tiergate_replica_ejections",
            "Replicas a worker left out of their deployment after failures in a row",
            ["deployment"],
            registry=r,
        )
        self.ledger_failures = Counter(
            "tiergate_ledger_write_failures", "Ledger entries that could not be written", registry=r
        )
        self.ledger_dead_letters = Counter(
            "tiergate_ledger_dead_letters",
            "Ledger events set aside by the sink: malformed (not decodable) or refused (by SQL)",
            ["kind"],
            registry=r,
        )
        self.budget_spent_ratio = Gauge(
            "tiergate_budget_spent_ratio",
            "Share of a budget spent in its current window (docs/costs.md)",
            ["tenant", "budget"],
            registry=r,
        )
        self.budget_alert = Gauge(
            "tiergate_budget_alert",
            "1 once a budget's spend reached the threshold (a fraction of its limit)",
            ["tenant", "budget", "threshold"],
            registry=r,
        )
        self.budget_refusals = Counter(
            "tiergate_budget_refusals",
            "Requests refused with 429 budget_exceeded, by tenant and budget",
            ["tenant", "budget"],
            registry=r,
        )
        self.budget_released = Counter(
            "tiergate_budget_reservations_released",
            "Budget reservations never settled, released after their bound (docs/costs.md)",
            ["tenant"],
            registry=r,
        )

    # -- helpers for callers outside the edge ------------------------------------------------

    def observe_attempts(self, attempts: Iterable[tuple[str, str]]) -> None:
        """Count backend calls: ``(deployment, outcome)`` pairs, e.g. from a ledger entry's
        ``attempts`` (``((a.deployment, a.outcome) for a in entry.attempts)``)."""
        for deployment, outcome in attempts:
            self.attempts.labels(deployment, outcome).inc()

    def count_dead_letter(self, kind: str) -> None:
        self.ledger_dead_letters.labels(kind=kind).inc()

    def set_breaker(self, deployment: str, state: str) -> None:
        """Export a breaker's state (``closed``, ``half_open`` or ``open``)."""
        self.breaker_state.labels(deployment).set(BREAKER_STATES[state])

    def count_ejection(self, deployment: str) -> None:
        """A replica of ``deployment`` was ejected (``gateway.queue.replicas.ejection``)."""
        self.replica_ejections.labels(deployment).inc()

    def declare_deployments(self, deployments: Iterable[str]) -> None:
        """Start every deployment's breaker at closed, so the series exists before any trip."""
        for deployment in deployments:
            self.breaker_state.labels(deployment).set(BREAKER_STATES["closed"])
