"""Queue wiring from settings: replica slot keys, per-tier capacities (tenants' fair-share
weights: ``TenantDirectory.weights``, which follows run-time tenants too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.queue.keys import RedisKeys
from gateway.queue.load import metrics_url
from gateway.queue.pool import Replica
from gateway.queue.snapshot import TierQueue
from gateway.settings import Settings

__all__ = [
    "assign_slots",
    "metrics_urls",
    "tier_deployments",
    "tier_queues",
]


def assign_slots(
    replicas: Mapping[str, Sequence[Replica]], settings: Settings, keys: RedisKeys
) -> None:
    """Give every replica its global slot key (capacity shared through Redis)."""
    for dep in settings.deployments:
        for replica in replicas.get(dep.model, ()):
            replica.slot_key = keys.slots(dep.tier.value, replica.backend.name)


def metrics_urls(settings: Settings) -> dict[str, str]:
    """Each vLLM replica's ``/metrics`` URL, by its backend name (``model#i``)."""
    return {
        f"{dep.model}#{i}": metrics_url(rep.url)
        for dep in settings.deployments
        if dep.provider == "vllm"
        for i, rep in enumerate(dep.replicas)
    }


def tier_deployments(settings: Settings) -> dict[str, list[str]]:
    tiers: dict[str, list[str]] = {}
    for dep in settings.deployments:
        tiers.setdefault(dep.tier.value, []).append(dep.model)
    return tiers


def _replica_names(settings: Settings, model: str) -> list[str]:
    dep = settings.deployment(model)
    if dep is None:
        return []
    if dep.provider == "vllm":
        return [f"{dep.model}#{i}" for i in range(len(dep.replicas))]
    return [dep.model]


def _capacities(settings: Settings, model: str) -> list[int]:
    dep = settings.deployment(model)
    if dep is None:
        return []
    if dep.provider == "vllm":
        return [r.max_num_seqs for r in dep.replicas]
    return [dep.replicas[0].max_num_seqs if dep.replicas else 64]


def tier_queues(settings: Settings, keys: RedisKeys) -> dict[str, TierQueue]:
    """Each tier's capacity and slot keys, as the queue snapshot reads them (the names must match
    the backends' names that ``services`` builds: ``model#i`` for vLLM, ``model`` for litellm)."""
    out: dict[str, TierQueue] = {}
    for tier, models in tier_deployments(settings).items():
        pairs = [(keys.slots(tier, n), m) for m in models for n in _replica_names(settings, m)]
        per_deployment = {m: sum(_capacities(settings, m)) for m in models}
        out[tier] = TierQueue(
            capacity=sum(per_deployment.values()),
            slot_keys=tuple(k for k, _ in pairs),
            slot_deployments=tuple(m for _, m in pairs),
            deployment_capacity=per_deployment,
        )
    return out
