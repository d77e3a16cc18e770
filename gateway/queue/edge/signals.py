"""Queue state into Prometheus gauges, from the cached snapshot (a scrape never scans Redis).

These are the signals to autoscale on (docs/queue.md): waiting jobs and the oldest job's age per
tier and lane, the expected wait per tier, and in-flight requests against capacity per
deployment.
"""

from __future__ import annotations

from gateway.metrics import Metrics
from gateway.queue.edge.snapshot import QueueSnapshot
from gateway.queue.keys import LANES

__all__ = ["publish_queue_metrics"]


def publish_queue_metrics(snapshot: QueueSnapshot, metrics: Metrics) -> None:
    for tier in snapshot.tiers:
        view = snapshot.view(tier)
        spec = snapshot.spec(tier)
        metrics.queue_depth.labels(tier).set(view.waiting)
        metrics.queue_expected_wait.labels(tier).set(view.expected_wait_s)
        for lane in LANES:
            metrics.queue_lane_depth.labels(tier, lane).set(view.depth.get(lane, 0))
            metrics.queue_oldest_age.labels(tier, lane).set(view.oldest_age_s.get(lane, 0.0))
        # running jobs only: a worker's slot held while it waits for one is not in flight
        busy: dict[str, int] = dict.fromkeys(spec.deployment_capacity, 0)
        for key, deployment in zip(spec.slot_keys, spec.slot_deployments, strict=True):
            busy[deployment] = busy.get(deployment, 0) + view.busy_by_key.get(key, 0)
        for deployment, n in busy.items():
            metrics.inflight.labels(deployment).set(n)
        for deployment, slots in spec.deployment_capacity.items():
            metrics.capacity_slots.labels(deployment).set(slots)
