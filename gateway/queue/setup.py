"""Queue wiring from settings and the replicas there are now: slot keys, per-tier capacities
(tenants' fair-share weights: ``TenantDirectory.weights``, which follows run-time tenants
too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.discovery.members import Member
from gateway.queue.edge.snapshot import TierQueue
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.load import metrics_url
from gateway.settings import Settings

__all__ = [
    "Members",
    "metrics_urls",
    "tier_deployments",
    "tier_queues",
]

Members = Mapping[str, Sequence[Member]]
"""The vLLM replicas of each deployment (``ReplicaDirectory.all``)."""


def metrics_urls(settings: Settings, members: Members | None = None) -> dict[str, str]:
    """Each vLLM replica's ``/metrics`` URL, by its backend name (``model#i``, or
    ``model@pod`` for the pods in ``members``, the replicas discovery found)."""
    members = members if members is not None else _configured(settings)
    return {m.name: metrics_url(m.url) for group in members.values() for m in group}


def _configured(settings: Settings) -> dict[str, tuple[Member, ...]]:
    return {
        dep.model: tuple(
            Member(f"{dep.model}#{i}", r.url, r.max_num_seqs) for i, r in enumerate(dep.replicas)
        )
        for dep in settings.deployments
        if dep.provider == "vllm"
    }


def tier_deployments(settings: Settings) -> dict[str, list[str]]:
    tiers: dict[str, list[str]] = {}
    for dep in settings.deployments:
        tiers.setdefault(dep.tier.value, []).append(dep.model)
    return tiers


def _slots(settings: Settings, members: Members, model: str) -> list[tuple[str, int]]:
    """(replica name, capacity) of each replica of ``model``."""
    dep = settings.deployment(model)
    if dep is None:
        return []
    if dep.provider == "vllm":
        return [(m.name, m.max_num_seqs) for m in members.get(model, ())]
    return [(dep.model, dep.replicas[0].max_num_seqs if dep.replicas else 64)]


def tier_queues(
    settings: Settings, keys: RedisKeys, members: Members | None = None
) -> dict[str, TierQueue]:
    """Each tier's capacity and slot keys, as the queue snapshot reads them (the names must match
    the backends' names that ``services`` builds: ``model#i`` for vLLM, ``model@pod`` for a
    discovered pod, ``model`` for litellm). ``members``: the vLLM replicas now (default: the
    configured ones)."""
    members = members if members is not None else _configured(settings)
    out: dict[str, TierQueue] = {}
    for tier, models in tier_deployments(settings).items():
        slots = {m: _slots(settings, members, m) for m in models}
        pairs = [(keys.slots(tier, name), m) for m in models for name, _ in slots[m]]
        per_deployment = {m: sum(c for _, c in slots[m]) for m in models}
        out[tier] = TierQueue(
            capacity=sum(per_deployment.values()),
            slot_keys=tuple(k for k, _ in pairs),
            slot_deployments=tuple(m for _, m in pairs),
            deployment_capacity=per_deployment,
        )
    return out
