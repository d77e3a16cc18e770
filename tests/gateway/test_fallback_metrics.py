"""Backend calls and fallbacks in the metrics, through the app with real workers and
simulators: every booked call is counted in ``tiergate_backend_attempts_total``, and an answer
from another deployment than the one the router chose counts in ``tiergate_fallbacks_total`` —
also when that one was skipped from the start because its whole tier is drained (issue 20)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from tests.inprocess import LARGE, SMALL, inprocess_gateway

ACME = {"authorization": "Bearer dev-acme"}


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def _counted(registry: CollectorRegistry, name: str, want: float, **labels: str) -> float:
    """The sample once it reaches ``want`` (a worker books its row just after it answers)."""
    for _ in range(100):
        if (value := _value(registry, name, **labels)) >= want:
            return value
        await asyncio.sleep(0.02)
    return _value(registry, name, **labels)


async def test_a_drained_tier_counts_as_a_fallback_and_calls_are_counted(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with inprocess_gateway(redis_url, key_prefix, tmp_path, models=(SMALL, LARGE)) as (
        services,
        _,
        client,
    ):
        registry = services.metrics.registry
        body = {"model": "large", "messages": [{"role": "user", "content": "hi"}]}
        served = await client.post("/v1/chat/completions", json=body, headers=ACME)
        assert served.status_code == 200, served.text
        assert served.headers["x-tiergate-model"] == LARGE
        assert await _counted(registry, "tiergate_backend_attempts_total", 1,
                              deployment=LARGE, outcome="ok") == 1  # fmt: skip
        assert registry.get_sample_value("tiergate_fallbacks_total", {
            "tier": "small", "planned": LARGE, "served": SMALL}) is None  # fmt: skip

        # the 70B's breaker opens (a drain does this when its replicas fail /health)
        assert services.breaker is not None and services.breaker_watch is not None
        await services.breaker.trip(LARGE)
        await services.breaker_watch.refresh()
        fell = await client.post("/v1/chat/completions", json=body, headers=ACME)
        assert fell.status_code == 200, fell.text
        assert fell.headers["x-tiergate-model"] == SMALL
        labels = {"tier": "small", "planned": LARGE, "served": SMALL}
        assert _value(registry, "tiergate_fallbacks_total", **labels) == 1
        assert await _counted(registry, "tiergate_backend_attempts_total", 1,
                              deployment=SMALL, outcome="ok") == 1  # fmt: skip
        assert _value(registry, "tiergate_backend_attempts_total",
                      deployment=LARGE, outcome="ok") == 1  # fmt: skip
