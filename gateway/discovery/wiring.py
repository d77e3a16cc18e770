"""Discovery at start-up, and what follows a deployment's replicas when they change.

``start_discovery`` starts one source per discovered deployment (EndpointSlices or DNS) feeding
the ``ReplicaDirectory``, and waits a few seconds for their first answer so that a process that
starts routes at once. ``FollowReplicas`` is the directory's listener in a process that runs
workers: it gives the pool, the load scraper, the health probe and the GPU clock the new
replicas. Every process's queue snapshot follows too (capacities and slot keys), through
``tier_queues``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from gateway.accounting.gpu_rates import ReplicaClock
from gateway.discovery.dns import DnsSource
from gateway.discovery.kube import EndpointSliceSource
from gateway.discovery.members import Member, ReplicaDirectory, pod_slots
from gateway.faults.health import HealthProbe
from gateway.queue.replicas.load import LoadScraper
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.setup import metrics_urls
from gateway.settings import DeploymentSettings, Settings

__all__ = ["FollowReplicas", "start_discovery"]

log = logging.getLogger(__name__)


async def start_discovery(
    settings: Settings,
    directory: ReplicaDirectory,
    stack: contextlib.AsyncExitStack,
    *,
    wait_s: float = 5.0,
) -> None:
    """Start discovering every deployment that asks for it (stopped when ``stack`` closes)."""
    deployments = [d for d in settings.deployments if d.discovery is not None]
    if not deployments:
        return
    # the API server's own session; a watch event is one line, an EndpointSlice of up to 100
    # endpoints in it: lines up to 1 MiB
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), read_bufsize=2**20)
    stack.push_async_callback(session.close)
    sources: list[EndpointSliceSource | DnsSource] = []
    for dep in deployments:
        assert dep.discovery is not None
        source: EndpointSliceSource | DnsSource
        slots = pod_slots(settings, dep)
        if dep.discovery.mode == "endpointslices":
            source = EndpointSliceSource(
                dep, settings.kubernetes, session, directory.update, slots=slots
            )
        else:
            source = DnsSource(dep, directory.update, slots=slots)
        source.start()
        stack.push_async_callback(source.aclose)
        sources.append(source)
    synced = await asyncio.gather(*(s.synced(wait_s) for s in sources))
    for dep, ok in zip(deployments, synced, strict=True):
        if not ok:
            log.warning("no replicas of %s found yet; routing to it once they are", dep.model)


@dataclass(slots=True)
class FollowReplicas:
    """Hands a deployment's new replicas to the worker's parts (a ``ReplicaDirectory``
    listener)."""

    settings: Settings
    directory: ReplicaDirectory
    make: Callable[[DeploymentSettings, Member], Replica]
    """A replica (backend and slot key) for one member."""
    pool: BackendPool
    load: LoadScraper
    probe: HealthProbe | None
    clock: ReplicaClock

    def __call__(self, deployment: str, members: Sequence[Member]) -> None:
        dep = self.settings.deployment(deployment)
        if dep is None:
            return
        left = self.pool.set_replicas(deployment, [self.make(dep, m) for m in members])
        if left:
            log.info("%s: %d replica(s) left; calls on them finish there", deployment, len(left))
        self.load.set_urls(metrics_urls(self.settings, self.directory.all()))
        urls = [m.url for m in members]
        if self.probe is not None:
            self.probe.set_replicas(deployment, urls)
        self.clock.set_replicas(deployment, urls)
