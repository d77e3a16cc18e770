"""A cached view of every tier's queue, refreshed in the background (never per request).

It feeds the router's ``Signals.expected_wait_s`` (spill-over), a 429's ``Retry-After``, and the
queue gauges in ``/metrics``. The expected wait of a tier is the work ahead of a new job divided
by the tier's throughput: ``waiting x service time / capacity``, plus nothing while slots are
free and nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.queue.capacity import SlotLeases
from gateway.queue.keys import LANES, RedisKeys
from gateway.tasks import stop_task
from router.catalog import Tier

__all__ = ["QueueSnapshot", "TierQueue", "TierView"]

log = logging.getLogger(__name__)

_DEFAULT_SERVICE_S = 1.0
"""Assumed backend time per job before any worker has published one."""


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
    service_s: float = _DEFAULT_SERVICE_S
    capacity: int = 0
    taken_at: float = 0.0

    @property
    def waiting(self) -> int:
        return sum(self.depth.values())

    @property
    def expected_wait_s(self) -> float:
        if self.capacity <= 0:
            return 0.0
        ahead = self.waiting + max(self.held - self.capacity + 1, 0)
        return ahead * self.service_s / self.capacity


class QueueSnapshot:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        tiers: Mapping[str, TierQueue],
        *,
        every_s: float = 0.5,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._tiers = dict(tiers)
        self._every_s = every_s
        self._leases = SlotLeases(redis)
        self._views: dict[str, TierView] = {}
        self._task: asyncio.Task[None] | None = None

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

    def expected_waits(self) -> dict[Tier, float]:
        known = {t.value for t in Tier}
        return {Tier(t): v.expected_wait_s for t, v in self._views.items() if t in known}

    @property
    def tiers(self) -> Sequence[str]:
        return sorted(self._tiers)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tiergate-queue-snapshot")

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except (RedisError, OSError) as exc:
                log.debug("queue snapshot not refreshed: %s", type(exc).__name__)
            await asyncio.sleep(self._every_s)

    async def refresh(self) -> None:
        for tier, spec in self._tiers.items():
            self._views[tier] = await self._read(tier, spec)

    async def _read(self, tier: str, spec: TierQueue) -> TierView:
        k = self._keys
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.mget([k.depth(tier, lane) for lane in LANES])
            pipe.get(k.service_time(tier))
            for lane in LANES:
                pipe.zrange(k.lane_tenants(tier, lane), 0, -1)
            depths, service, *tenants = await pipe.execute()
        held = await self._leases.held(spec.slot_keys)
        now = time.time()
        oldest: dict[str, float] = {}
        for lane, members in zip(LANES, tenants, strict=True):
            first = await self._oldest_waiting(tier, lane, [m.decode() for m in members])
            oldest[lane] = max(now - first, 0.0) if first is not None else 0.0
        return TierView(
            depth={lane: max(int(v or 0), 0) for lane, v in zip(LANES, depths, strict=True)},
            oldest_age_s=oldest,
            held=sum(held),
            held_by_key=dict(zip(spec.slot_keys, held, strict=True)),
            service_s=float(service) if service else _DEFAULT_SERVICE_S,
            capacity=spec.capacity,
            taken_at=now,
        )

    async def _oldest_waiting(self, tier: str, lane: str, tenants: list[str]) -> float | None:
        """Enqueue time (Unix s, from the entry id) of the oldest job no worker has taken."""
        oldest: float | None = None
        for tenant in tenants:
            stream = self._keys.jobs(tier, lane, tenant)
            with contextlib.suppress(RedisError):
                groups = await self._redis.xinfo_groups(stream)
                group = self._keys.group.encode()
                last = next((g["last-delivered-id"] for g in groups if g["name"] == group), b"0-0")
                entries = await self._redis.xrange(stream, min=b"(" + bytes(last), count=1)
                if entries:
                    entry_id: Any = entries[0][0]
                    at = int(bytes(entry_id).split(b"-")[0]) / 1000
                    oldest = at if oldest is None else min(oldest, at)
        return oldest
