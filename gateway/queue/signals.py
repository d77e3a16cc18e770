"""Queue state into Prometheus gauges, from the cached snapshot (a scrape never scans Redis)."""

from __future__ import annotations

from gateway.metrics import Metrics
from gateway.queue.snapshot import QueueSnapshot

__all__ = ["publish_queue_metrics"]


def publish_queue_metrics(snapshot: QueueSnapshot, metrics: Metrics) -> None:
    for tier in snapshot.tiers:
        view = snapshot.view(tier)
        metrics.queue_depth.labels(tier).set(view.waiting)
