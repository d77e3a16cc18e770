"""A cached view of every tier's queue, refreshed in the background (never per request).

It feeds the router's ``Signals.expected_wait_s`` and ``Signals.service_s`` (spill-over), a
429's ``Retry-After``, and the queue gauges in ``/metrics``. The expected wait of a tier is the
work ahead of a new job divided by the tier's throughput: ``waiting x service time / capacity``,
plus nothing while slots are free and nothing waits.

It also estimates, per lane and tenant, when a new job would start (``TierView.start_in``), for
the edge's deadline admission (``gateway.queue.edge.deadline``): the work ahead of it (every job of
the higher lanes; in its own lane, what fair share serves before it) at the tier's full
throughput, or at the rate the lane was actually drained while it had work waiting (a lane
that higher lanes crowd out drains slower than capacity), whichever is slower.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.loops import Loop
from gateway.queue.keys import LANES, RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import IDLE_MARK
from router.catalog import Tier

__all__ = ["QueueSnapshot", "TierQueue", "TierView"]

log = logging.getLogger(__name__)

_DEFAULT_SERVICE_S = 1.0
"""Assumed backend time per job before any worker has published one."""

_RATE_WINDOW_S = 5.0
"""A lane's drain rate is measured over at least this long (and two service times) ..."""
_RATE_KEEP_S = 120.0
"""... from samples kept this long at most."""


@dataclass(frozen=True, slots=True)
class TierQueue:
    """What the snapshot needs to know of a tier: its slots and the keys that lease them."""

    capacity: int
    slot_keys: tuple[str, ...] = ()
    slot_deployments: tuple[str, ...] = ()
    """The deployment of each of ``slot_keys``."""
    deployment_capacity: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TierView:
    depth: Mapping[str, int] = field(default_factory=dict)
    """Waiting jobs per lane."""
    oldest_age_s: Mapping[str, float] = field(default_factory=dict)
    """Age of the oldest job not yet taken, per lane (0 when none waits)."""
    held: int = 0
    """Slots held on the tier's replicas (global in-flight)."""
    held_by_key: Mapping[str, int] = field(default_factory=dict)
    busy_by_key: Mapping[str, int] = field(default_factory=dict)
    """Of ``held_by_key``, the leases running a job (not a worker's slot held in wait)."""
    service_s: float = _DEFAULT_SERVICE_S
    capacity: int = 0
    taken_at: float = 0.0
    tenant_waiting: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Waiting jobs per lane and tenant (the tenants with work in the lane)."""
    drain_rps: Mapping[str, float] = field(default_factory=dict)
    """Jobs started per second from each lane that had work waiting throughout the last rate
    window (absent: not measured)."""

    @property
    def waiting(self) -> int:
        return sum(self.depth.values())

    @property
    def expected_wait_s(self) -> float:
        if self.capacity <= 0:
            return 0.0
        ahead = self.waiting + max(self.held - self.capacity + 1, 0)
        return ahead * self.service_s / self.capacity

    def ahead_of(self, lane: str, tenant: str, weight: float = 1.0) -> tuple[int, int]:
        """Jobs that start before a new job of ``tenant`` in ``lane``: those of the higher
        lanes, and those of its own lane that fair share serves first (its own waiting jobs,
        and per other tenant with work there as many as its share allows, assuming they have
        the default weight; never more than the lane holds)."""
        index = LANES.index(lane) if lane in LANES else LANES.index("standard")
        higher = sum(self.depth.get(name, 0) for name in LANES[:index])
        waiting = self.tenant_waiting.get(LANES[index], {})
        own = waiting.get(tenant, 0)
        others = sum(1 for name, n in waiting.items() if name != tenant and n > 0)
        share = own + math.ceil((own + 1) * others / max(weight, 1e-9))
        return higher, min(self.depth.get(LANES[index], 0), share)

    def start_in(self, lane: str, tenant: str, weight: float = 1.0) -> float:
        """Seconds until a new job of ``tenant`` in ``lane`` is expected to start: the jobs
        ahead of it at the tier's throughput, or at its lane's measured drain rate when that is
        slower (0 when nothing is ahead and a slot is free)."""
        if self.capacity <= 0:
            return 0.0
        higher, in_lane = self.ahead_of(lane, tenant, weight)
        excess = max(self.held - self.capacity + 1, 0)
        wait = (higher + in_lane + excess) * self.service_s / self.capacity
        rate = self.drain_rps.get(lane_name(lane), 0.0)
        if rate > 0:
            wait = max(wait, in_lane / rate)
        return wait


def lane_name(lane: str) -> str:
    return lane if lane in LANES else "standard"


class QueueSnapshot:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        tiers: Mapping[str, TierQueue],
        *,
        every_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: Unix time (s), for the ages of waiting jobs and the lanes' drain rates."""
        self._redis = redis
        self._keys = keys
        self._tiers = dict(tiers)
        self._clock = clock
        self._leases = SlotLeases(redis)
        self._views: dict[str, TierView] = {}
        self._samples: dict[tuple[str, str], deque[tuple[float, int, int]]] = {}
        """Per (tier, lane): (time, jobs taken ever, jobs waiting) at each refresh."""
        self._loop = Loop(
            "tiergate-queue-snapshot",
            self.refresh,
            every_s=every_s,
            catch=(RedisError, OSError),
            on_error=lambda exc: log.debug("queue snapshot not refreshed: %s", type(exc).__name__),
        )

    def set_tiers(self, tiers: Mapping[str, TierQueue]) -> None:
        """New capacities and slot keys (replicas that joined or left); read from the next
        refresh on."""
        self._tiers = dict(tiers)

    def spec(self, tier: str) -> TierQueue:
        return self._tiers.get(tier, TierQueue(0))

    def view(self, tier: str) -> TierView:
        view = self._views.get(tier)
        return (
            view
            if view is not None
            else TierView(capacity=self._tiers.get(tier, TierQueue(0)).capacity)
        )

    def expected_wait(self, tier: str) -> float:
        return self.view(tier).expected_wait_s

    def start_waits(self, lane: str, tenant: str, weight: float = 1.0) -> dict[Tier, float]:
        """Per tier, when a new job of ``tenant`` in ``lane`` would start (``start_in``): the
        wait that request would see, not the whole tier's queue."""
        known = {t.value for t in Tier}
        return {
            Tier(t): v.start_in(lane, tenant, weight) for t, v in self._views.items() if t in known
        }

    def service_times(self) -> dict[Tier, float]:
        """Each tier's typical job time (the workers' published average, else the default)."""
        known = {t.value for t in Tier}
        return {Tier(t): v.service_s for t, v in self._views.items() if t in known}

    @property
    def tiers(self) -> Sequence[str]:
        return sorted(self._tiers)

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.aclose()

    async def refresh(self) -> None:
        for tier, spec in list(self._tiers.items()):
            self._views[tier] = await self._read(tier, spec)

    async def _read(self, tier: str, spec: TierQueue) -> TierView:
        k = self._keys
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.mget([k.depth(tier, lane) for lane in LANES])
            pipe.get(k.service_time(tier))
            pipe.mget([k.taken(tier, lane) for lane in LANES])
            for lane in LANES:
                pipe.zrange(k.lane_tenants(tier, lane), 0, -1)
            depths, service, taken, *tenants = await pipe.execute()
        counts = await self._leases.held_busy(spec.slot_keys, IDLE_MARK)
        held = [total for total, _ in counts]
        now = self._clock()
        depth = {lane: max(int(v or 0), 0) for lane, v in zip(LANES, depths, strict=True)}
        service_s = float(service) if service else _DEFAULT_SERVICE_S
        oldest: dict[str, float] = {}
        per_tenant: dict[str, dict[str, int]] = {}
        drain: dict[str, float] = {}
        for lane, members, count in zip(LANES, tenants, taken, strict=True):
            first, per_tenant[lane] = await self._waiting(tier, lane, [m.decode() for m in members])
            oldest[lane] = max(now - first, 0.0) if first is not None else 0.0
            rate = self._drain_rate((tier, lane), now, int(count or 0), depth[lane], service_s)
            if rate is not None:
                drain[lane] = rate
        return TierView(
            depth=depth,
            oldest_age_s=oldest,
            held=sum(held),
            held_by_key=dict(zip(spec.slot_keys, held, strict=True)),
            busy_by_key={k: busy for k, (_, busy) in zip(spec.slot_keys, counts, strict=True)},
            service_s=service_s,
            capacity=spec.capacity,
            taken_at=now,
            tenant_waiting=per_tenant,
            drain_rps=drain,
        )

    def _drain_rate(
        self, key: tuple[str, str], now: float, taken: int, waiting: int, service_s: float
    ) -> float | None:
        """Jobs per second started from a lane over the last window, if work waited in it at
        every sample of that window (else the rate says how much work came, not how fast it
        goes)."""
        samples = self._samples.setdefault(key, deque())
        samples.append((now, taken, waiting))
        while samples and now - samples[0][0] > _RATE_KEEP_S:
            samples.popleft()
        window = max(_RATE_WINDOW_S, 2 * service_s)
        start: tuple[float, int, int] | None = None
        for sample in reversed(samples):
            if sample[2] <= 0:
                return None
            if now - sample[0] >= window:
                start = sample
                break
        if start is None or taken < start[1]:
            return None  # not measured long enough, or the counter was lost with Redis
        return (taken - start[1]) / (now - start[0])

    async def _waiting(
        self, tier: str, lane: str, tenants: list[str]
    ) -> tuple[float | None, dict[str, int]]:
        """Enqueue time (Unix s, from the entry id) of the oldest job no worker has taken, and
        the jobs each tenant has waiting (entries not yet delivered: stream length less the
        delivered ones, which stay until acknowledged and deleted together)."""
        oldest: float | None = None
        waiting: dict[str, int] = {}
        for tenant in tenants:
            stream = self._keys.jobs(tier, lane, tenant)
            with contextlib.suppress(RedisError):
                groups = await self._redis.xinfo_groups(stream)
                group = self._keys.group.encode()
                mine = next((g for g in groups if g["name"] == group), None)
                last = mine["last-delivered-id"] if mine is not None else b"0-0"
                pending = int(mine["pending"]) if mine is not None else 0
                waiting[tenant] = max(int(await self._redis.xlen(stream)) - pending, 0)
                entries = await self._redis.xrange(stream, min=b"(" + bytes(last), count=1)
                if entries:
                    entry_id: Any = entries[0][0]
                    at = int(bytes(entry_id).split(b"-")[0]) / 1000
                    oldest = at if oldest is None else min(oldest, at)
        return oldest, waiting
