"""The replicas of every deployment, and the slots they may hold.

With ``SlotLeases`` (Redis), a replica never holds more in-flight requests from tiergate than its
capacity (vLLM ``max_num_seqs``), across every process: ``lease`` takes a slot lease before it
yields the backend, and gives it back after. A worker reserves a slot *before* it takes a job
(``reserve``) and hands it to the job's task (``holding``), so the job's first ``lease`` uses it
without waiting. Held leases are renewed in the background; a dead process's leases expire.

Among a deployment's replicas the choice is the least loaded by this process's count (a
``chooser`` may rank them by live load instead); with ``affinity`` (the default) a conversation's
home replica goes first (``gateway.queue.affinity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from redis.exceptions import RedisError

from backends.errors import BackendUnavailable
from backends.protocol import Backend
from gateway.queue.affinity import home_first, home_of
from gateway.queue.capacity import SlotLeases, epoch_key_of
from gateway.tasks import stop_task

__all__ = ["BackendPool", "Chooser", "Replica", "Reservation"]

log = logging.getLogger(__name__)

_POLL_S = (0.002, 0.05)
"""Backoff bounds while waiting for a free slot."""


@dataclass(slots=True)
class Replica:
    backend: Backend
    capacity: int
    inflight: int = 0
    slot_key: str = ""
    """``RedisKeys.slots`` of this replica; empty: capacity is counted in this process only."""

    @property
    def load(self) -> float:
        return self.inflight / self.capacity


@dataclass(frozen=True, slots=True)
class Reservation:
    """A slot lease held on ``replica`` of ``deployment``."""

    deployment: str
    replica: Replica
    lease_id: str


Chooser = Callable[[str, Sequence[Replica]], list[Replica]]
"""Ranks a deployment's replicas, best first (may leave out replicas to skip)."""


def _least_loaded(deployment: str, group: Sequence[Replica]) -> list[Replica]:
    return sorted(group, key=lambda r: r.load)


class BackendPool:
    def __init__(
        self,
        replicas: Mapping[str, Sequence[Replica]],
        *,
        leases: SlotLeases | None = None,
        owner: str = "local",
        chooser: Chooser | None = None,
        max_wait_s: float = 30.0,
        affinity: bool = True,
    ) -> None:
        """``affinity``: honour conversation keys (``queue.affinity``); off, they are ignored."""
        self._replicas = {name: list(group) for name, group in replicas.items()}
        self._leases = leases
        self._owner = owner
        self._chooser = chooser or _least_loaded
        self._max_wait_s = max_wait_s
        self._affinity = affinity
        self._ids = itertools.count()
        self._held: dict[str, tuple[str, str]] = {}
        """lease id -> (slot key, lease id), renewed in the background."""
        self._bound: dict[asyncio.Task[object], Reservation] = {}
        self._renewer: asyncio.Task[None] | None = None

    def capacity(self, deployment: str) -> int:
        return sum(r.capacity for r in self._replicas.get(deployment, ()))

    def replicas(self, deployment: str) -> list[Replica]:
        return list(self._replicas.get(deployment, ()))

    def slot_keys(self, deployments: Sequence[str]) -> list[str]:
        return [r.slot_key for d in deployments for r in self._replicas.get(d, ()) if r.slot_key]

    def __contains__(self, deployment: str) -> bool:
        return deployment in self._replicas

    # -- slots ------------------------------------------------------------------------------

    async def _try(self, deployment: str, replica: Replica) -> Reservation | None:
        lease_id = self.new_lease_id()
        if self._leases is None or not replica.slot_key:
            if replica.inflight >= replica.capacity and self._leases is not None:
                return None
            replica.inflight += 1
            return Reservation(deployment, replica, lease_id)
        if not await self._leases.acquire(replica.slot_key, lease_id, replica.capacity):
            return None
        self._held[lease_id] = (replica.slot_key, lease_id)
        replica.inflight += 1
        return Reservation(deployment, replica, lease_id)

    def ranked(self, deployment: str, affinity: str | None = None) -> list[Replica]:
        """``deployment``'s replicas with a global slot key, best first (the chooser's order;
        with ``affinity``, a conversation key, its home replica first; see
        ``gateway.queue.affinity``)."""
        every = self._replicas.get(deployment, [])
        key = affinity if self._affinity else None
        group = home_first(self._chooser(deployment, every), every, key)
        return [r for r in group if r.slot_key]

    def new_lease_id(self) -> str:
        return f"{self._owner}:{next(self._ids)}"

    @property
    def lease_ms(self) -> int | None:
        """How long a slot lease lasts unrenewed; ``None``: no global slots."""
        return None if self._leases is None else self._leases.lease_ms

    def adopt(self, deployment: str, replica: Replica, lease_id: str) -> Reservation:
        """A reservation for a lease taken elsewhere (``DirectStart``), renewed from now on."""
        self._held[lease_id] = (replica.slot_key, lease_id)
        replica.inflight += 1
        return Reservation(deployment, replica, lease_id)

    async def reserve(self, deployments: Sequence[str]) -> Reservation | None:
        """A slot on the best replica of the first of ``deployments`` that has one free."""
        for deployment in deployments:
            for replica in self._chooser(deployment, self._replicas.get(deployment, ())):
                got = await self._try(deployment, replica)
                if got is not None:
                    return got
        return None

    async def release(self, reservation: Reservation) -> None:
        reservation.replica.inflight -= 1
        if self._held.pop(reservation.lease_id, None) is not None and self._leases is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._leases.release(reservation.replica.slot_key, reservation.lease_id)

    @asynccontextmanager
    async def holding(self, reservation: Reservation) -> AsyncIterator[None]:
        """Lets the current task's first ``lease`` of the reservation's deployment use it;
        releases it afterwards if no lease did."""
        task = asyncio.current_task()
        assert task is not None
        self._bound[task] = reservation
        try:
            yield
        finally:
            left = self._bound.pop(task, None)
            if left is not None:
                await self.release(left)

    @asynccontextmanager
    async def lease(
        self, deployment: str, *, deadline: float | None = None, affinity: str | None = None
    ) -> AsyncIterator[Backend]:
        """A replica of ``deployment`` with a slot held for the caller while leased. Waits for a
        slot until ``deadline`` (Unix s) or the pool's ``max_wait_s``; then raises
        ``BackendUnavailable``. ``affinity``: a conversation key; a slot reserved elsewhere is
        traded for one on the conversation's home replica when that one has room."""
        reservation = self._take_bound(deployment)
        if reservation is not None and affinity is not None and self._affinity:
            reservation = await self._at_home(deployment, reservation, affinity)
        if reservation is None:
            reservation = await self._wait_for_slot(deployment, deadline)
        try:
            yield reservation.replica.backend
        finally:
            await self.release(reservation)

    async def _at_home(
        self, deployment: str, reservation: Reservation, affinity: str
    ) -> Reservation:
        every = self._replicas.get(deployment, [])
        home = home_of(affinity, every) if len(every) > 1 else None
        if (
            home is None
            or home is reservation.replica
            or home not in self._chooser(deployment, every)
        ):
            return reservation
        try:
            moved = await self._try(deployment, home)
        except (RedisError, OSError):
            return reservation
        if moved is None:
            return reservation  # home is full: stay where the slot is
        await self.release(reservation)
        return moved

    def _take_bound(self, deployment: str) -> Reservation | None:
        task = asyncio.current_task()
        bound = self._bound.get(task) if task is not None else None
        if bound is None or bound.deployment != deployment:
            return None
        del self._bound[task]  # type: ignore[arg-type]
        return bound

    async def _wait_for_slot(self, deployment: str, deadline: float | None) -> Reservation:
        if deployment not in self._replicas:
            raise KeyError(deployment)
        give_up = time.time() + self._max_wait_s
        if deadline is not None:
            give_up = min(give_up, deadline)
        pause = _POLL_S[0]
        while True:
            try:
                got = await self.reserve([deployment])
            except (RedisError, OSError) as exc:
                raise BackendUnavailable(f"{deployment}: slot leases unavailable: {exc}") from exc
            if got is not None:
                return got
            if time.time() + pause >= give_up:
                raise BackendUnavailable(f"{deployment}: no free slot on any replica")
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._leases is not None and self._renewer is None:
            self._renewer = asyncio.create_task(self._renew(), name="tiergate-slot-renewer")

    async def _renew(self) -> None:
        assert self._leases is not None
        every = self._leases.lease_ms / 3000
        while True:
            await asyncio.sleep(every)
            by_key: dict[str, list[tuple[str, str]]] = {}
            for key, lease_id in list(self._held.values()):
                by_key.setdefault(epoch_key_of(key), []).append((key, lease_id))
            for group in by_key.values():  # one script per tier: one Cluster slot each
                try:
                    await self._leases.renew(group)
                except (RedisError, OSError) as exc:
                    log.warning("cannot renew slot leases: %s", type(exc).__name__)

    async def aclose(self) -> None:
        if self._renewer is not None:
            await stop_task(self._renewer)
            self._renewer = None
        backends = [r.backend for group in self._replicas.values() for r in group]
        await asyncio.gather(*(b.aclose() for b in backends), return_exceptions=True)
