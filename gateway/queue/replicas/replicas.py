"""A deployment's replicas as the worker's pool holds them: a backend each (vLLM over HTTP, or
litellm for a hosted API) with the slot key its capacity is leased on; and the per-tier slot
counts for tiers the pool has no replica of.

Backends are built through the provider table (``backends.factory.make_backend``), by the
deployment's ``provider``: the adapter's module is imported only when a deployment names it."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from backends.factory import make_backend
from gateway.discovery.members import Member
from gateway.faults.wiring import backend_timeouts
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.pool import Replica
from gateway.settings import DeploymentSettings, FallbackSettings, Settings, read_secret

__all__ = ["make_replicas", "tier_capacity", "vllm_replica"]


def vllm_replica(
    dep: DeploymentSettings,
    member: Member,
    session: aiohttp.ClientSession,
    fallback: FallbackSettings,
    keys: RedisKeys,
) -> Replica:
    backend = make_backend(
        dep.provider,
        name=member.name,
        base_url=member.url,
        session=session,
        api_key=read_secret(dep.api_key_env) if dep.api_key_env else None,
        **backend_timeouts(fallback, dep),
    )
    return Replica(backend, member.max_num_seqs, slot_key=keys.slots(dep.tier.value, member.name))


def make_replicas(
    dep: DeploymentSettings,
    session: aiohttp.ClientSession,
    fallback: FallbackSettings,
    members: Sequence[Member],
    keys: RedisKeys,
) -> list[Replica]:
    """``members``: a vLLM deployment's replicas now (``ReplicaDirectory``)."""
    if dep.provider == "vllm":
        return [vllm_replica(dep, m, session, fallback, keys) for m in members]
    api_key = read_secret(dep.api_key_env) if dep.api_key_env else None
    api_base = dep.replicas[0].url if dep.replicas else None
    capacity = dep.replicas[0].max_num_seqs if dep.replicas else 64
    backend = make_backend(
        dep.provider,
        name=dep.model,
        litellm_model=dep.litellm_model or dep.model,
        api_base=api_base,
        api_key=api_key or ("sk-unused-local" if api_base else None),
        session=session,
        **backend_timeouts(fallback, dep),
    )
    return [Replica(backend, capacity, slot_key=keys.slots(dep.tier.value, dep.model))]


def tier_capacity(settings: Settings) -> dict[str, int]:
    capacity: dict[str, int] = {}
    for dep in settings.deployments:
        slots = sum(r.max_num_seqs for r in dep.replicas) or 64
        capacity[dep.tier.value] = capacity.get(dep.tier.value, 0) + slots
    return capacity
