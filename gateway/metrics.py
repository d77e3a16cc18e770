"""tiergate's Prometheus metrics, on a registry of their own (never the process-global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tiergate_requests",
            "Requests answered, by tier and outcome (ok or error code)",
            ["tier", "outcome"],
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
            "End-to-end request time at the edge",
            ["tier", "stream"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "tiergate_overhead_seconds",
            "Time spent in tiergate itself (excluding queue wait and backend time)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
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
            "tiergate_tokens", "Tokens billed, by tier and kind", ["tier", "kind"], registry=r
        )
        self.attempts = Counter(
            "tiergate_backend_attempts",
            "Backend calls, by deployment and outcome",
            ["deployment", "outcome"],
            registry=r,
        )
        self.unknown_price = Counter(
            "tiergate_unknown_price_requests",
            "Requests booked without a known price (flagged in the ledger)",
            ["deployment"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "tiergate_queue_depth", "Jobs waiting in a tier's stream", ["tier"], registry=r
        )
        self.ledger_failures = Counter(
            "tiergate_ledger_write_failures", "Ledger entries that could not be written", registry=r
        )
