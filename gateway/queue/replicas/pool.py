"""The replicas of every deployment, and the slots they may hold.

With ``SlotLeases`` (Redis), a replica never holds more in-flight requests from tiergate than its
capacity (vLLM ``max_num_seqs``), across every process: ``lease`` takes a slot lease before it
yields the backend, and gives it back after. A worker reserves a slot *before* it takes a job
(``reserve``) and hands it to the job's task (``holding``), so the job's first ``lease`` uses it
without waiting. Held leases are renewed in the background; a dead process's leases expire.

Among a deployment's replicas the choice is the least loaded by this process's count (a
``chooser`` may rank them by live load instead); with ``affinity`` (the default) a conversation's
home replica goes first (``gateway.queue.replicas.affinity``).

A deployment's replicas may change while it runs (``set_replicas``: the pods discovery finds,
``gateway.discovery``). A replica that leaves gets no new lease; the calls it holds go on to
their end on it (a failed one is retried by the executor on the replicas left). A deployment
with no replica at the moment refuses a lease at once (``BackendUnavailable``: the fallback chain
moves on instead of waiting for a slot that cannot come).

A replica that keeps failing is ejected for a cool-down (``ejections``, outlier ejection:
``gateway.queue.replicas.ejection``): no replica is chosen while it is out, save when every
replica of the deployment is (then all are candidates: the deployment's breaker judges it).
A replica's failures are ejection's to answer for while others are usable, and the breaker's
once it is the last. Calls report their verdicts per replica (``replica_failed``,
``replica_answered``, ``replica_no_verdict``); the last usable replica of a deployment is never
ejected.

A worker's *idle* reservation (``reserve(..., idle=True)``: a slot held while it waits for a job)
has a lease id ending in ``IDLE_MARK``; ``busy`` renames it when a job takes it, so the queue
snapshot tells slots running work from slots held in wait (``SlotLeases.held_busy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import tenacity
from redis.exceptions import RedisError

from backends.errors import BackendUnavailable
from backends.protocol import Backend
from gateway.loops import Loop
from gateway.queue.replicas.affinity import home_first, home_of
from gateway.queue.replicas.capacity import SlotLeases, epoch_key_of
from gateway.queue.replicas.ejection import EjectionPolicy, Ejections

__all__ = [
    "IDLE_MARK",
    "SLOT_POLL_S",
    "BackendPool",
    "Chooser",
    "Replica",
    "Reservation",
    "until_reserved",
]

log = logging.getLogger(__name__)

SLOT_POLL_S = (0.002, 0.05)
"""The pauses between tries for a free slot: the first, and the longest."""

IDLE_MARK = "~idle"
"""The end of the lease id of a slot held by a worker waiting for a job."""


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


async def until_reserved(
    reserve: Callable[[], Awaitable[Reservation | None]],
    *,
    stop: tenacity.stop.stop_base = tenacity.stop_never,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Reservation:
    """What ``reserve()`` reserves: tried at once, then again after pauses growing from 2 to
    50 ms (``SLOT_POLL_S``) while it finds no free slot; ``tenacity.RetryError`` once
    ``stop`` says so. Its errors are raised as they come. The first try builds no tenacity
    object: as a rule a slot is free."""
    got = await reserve()
    if got is not None:
        return got
    polling = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_result(lambda got: got is None),
        wait=tenacity.wait_exponential(multiplier=SLOT_POLL_S[0], max=SLOT_POLL_S[1]),
        stop=stop,
        sleep=sleep,
    )

    async def attempt() -> Reservation | None:  # a coroutine function: tenacity awaits it
        return await reserve()

    reservation: Reservation = await polling(attempt)
    return reservation


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
        ejections: Ejections | None = None,
    ) -> None:
        """``affinity``: honour conversation keys (``queue.affinity``); off, they are ignored.
        ``ejections``: the replicas' outlier state (``None``: none is ever ejected)."""
        self._replicas = {name: list(group) for name, group in replicas.items()}
        self._leases = leases
        self._owner = owner
        self._chooser = chooser or _least_loaded
        self._max_wait_s = max_wait_s
        self._affinity = affinity
        self._ejections = ejections or Ejections(EjectionPolicy(after=0))
        self._ids = itertools.count()
        self._held: dict[str, tuple[str, str]] = {}
        """lease id -> (slot key, lease id), renewed in the background."""
        self._bound: dict[asyncio.Task[object], Reservation] = {}
        self._renewer = Loop(  # every third of a lease
            "tiergate-slot-renewer",
            self._renew,
            every_s=leases.lease_ms / 3000 if leases is not None else 0.0,
            pause_first=True,
        )
        self._retired: list[Replica] = []
        """Replicas that left while calls ran on them: closed when the last one ends."""
        self._closing: set[asyncio.Task[None]] = set()

    def capacity(self, deployment: str) -> int:
        return sum(r.capacity for r in self._replicas.get(deployment, ()))

    def replicas(self, deployment: str) -> list[Replica]:
        return list(self._replicas.get(deployment, ()))

    def slot_keys(self, deployments: Sequence[str]) -> list[str]:
        return [r.slot_key for d in deployments for r in self._replicas.get(d, ()) if r.slot_key]

    def __contains__(self, deployment: str) -> bool:
        return deployment in self._replicas

    def set_replicas(self, deployment: str, replicas: Sequence[Replica]) -> list[Replica]:
        """Make ``replicas`` the deployment's replicas; one already there (same backend name) is
        kept as it is (its count of calls too). Returns the replicas that left: closed here once
        no call runs on them."""
        current = {r.backend.name: r for r in self._replicas.get(deployment, ())}
        wanted = [current.get(r.backend.name, r) for r in replicas]
        names = {r.backend.name for r in wanted}
        left = [r for name, r in current.items() if name not in names]
        self._replicas[deployment] = wanted
        for replica in left:
            self._ejections.forget(deployment, replica.backend.name)
        self._retired.extend(left)
        self._close_retired()
        return left

    def _close_retired(self) -> None:
        done = [r for r in self._retired if r.inflight <= 0]
        self._retired = [r for r in self._retired if r.inflight > 0]
        for replica in done:
            task = asyncio.get_running_loop().create_task(replica.backend.aclose())
            self._closing.add(task)  # a reference until it is done (the loop keeps weak ones)
            task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("closing a retired replica failed: %r", task.exception())

    # -- ejection ---------------------------------------------------------------------------

    def _usable(self, deployment: str) -> list[Replica]:
        """``deployment``'s replicas not ejected (all of them when every one is)."""
        every = self._replicas.get(deployment, [])
        usable = [r for r in every if self._ejections.usable(deployment, r.backend.name)]
        return usable or list(every)

    def replica_failed(self, deployment: str, replica: str) -> bool:
        """A backend-caused failure of a call on ``replica`` (a backend name); whether the
        deployment's breaker is to be told of it (ejection does not answer for it: it was the
        last usable replica, or ejection is off)."""
        others = [r for r in self._replicas.get(deployment, []) if r.backend.name != replica]
        last = not any(self._ejections.usable(deployment, r.backend.name) for r in others)
        return self._ejections.failed(deployment, replica, last=last)

    def replica_answered(self, deployment: str, replica: str) -> None:
        self._ejections.succeeded(deployment, replica)

    def replica_no_verdict(self, deployment: str, replica: str) -> None:
        """A call on ``replica`` ended neither answered nor failed by its backend."""
        self._ejections.no_verdict(deployment, replica)

    # -- slots ------------------------------------------------------------------------------

    async def _try(
        self, deployment: str, replica: Replica, *, idle: bool = False
    ) -> Reservation | None:
        lease_id = self.new_lease_id() + (IDLE_MARK if idle else "")
        if self._leases is None or not replica.slot_key:
            if replica.inflight >= replica.capacity and self._leases is not None:
                return None
        elif not await self._leases.acquire(replica.slot_key, lease_id, replica.capacity):
            return None
        else:
            self._held[lease_id] = (replica.slot_key, lease_id)
        replica.inflight += 1
        self._ejections.chosen(deployment, replica.backend.name, lease_id.removesuffix(IDLE_MARK))
        return Reservation(deployment, replica, lease_id)

    def ranked(self, deployment: str, affinity: str | None = None) -> list[Replica]:
        """``deployment``'s replicas with a global slot key, best first (the chooser's order;
        with ``affinity``, a conversation key, its home replica first; see
        ``gateway.queue.replicas.affinity``)."""
        every = self._replicas.get(deployment, [])
        key = affinity if self._affinity else None
        group = home_first(self._chooser(deployment, self._usable(deployment)), every, key)
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
        self._ejections.chosen(deployment, replica.backend.name, lease_id.removesuffix(IDLE_MARK))
        return Reservation(deployment, replica, lease_id)

    async def reserve(
        self, deployments: Sequence[str], *, idle: bool = False
    ) -> Reservation | None:
        """A slot on the best replica of the first of ``deployments`` that has one free.
        ``idle``: held for a job not taken yet (``busy`` when one is)."""
        for deployment in deployments:
            for replica in self._chooser(deployment, self._usable(deployment)):
                got = await self._try(deployment, replica, idle=idle)
                if got is not None:
                    return got
        return None

    async def busy(self, reservation: Reservation) -> Reservation:
        """An idle reservation (``reserve(..., idle=True)``) now running a job: its lease renamed
        to a busy one. If Redis fails, the old one is kept (only the in-flight figure is off)."""
        if not reservation.lease_id.endswith(IDLE_MARK):
            return reservation
        new_id = reservation.lease_id.removesuffix(IDLE_MARK)
        key = reservation.replica.slot_key
        if self._leases is not None and key and reservation.lease_id in self._held:
            try:
                await self._leases.rename(key, reservation.lease_id, new_id)
            except (RedisError, OSError):
                return reservation
            self._held.pop(reservation.lease_id, None)
            self._held[new_id] = (key, new_id)
        return Reservation(reservation.deployment, reservation.replica, new_id)

    async def release(self, reservation: Reservation, *, called: bool = False) -> None:
        """``called``: a call was made on it (its verdict is reported apart)."""
        reservation.replica.inflight -= 1
        if not called:
            self._ejections.unchosen(
                reservation.deployment,
                reservation.replica.backend.name,
                reservation.lease_id.removesuffix(IDLE_MARK),
            )
        if self._held.pop(reservation.lease_id, None) is not None and self._leases is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._leases.release(reservation.replica.slot_key, reservation.lease_id)
        if self._retired:
            self._close_retired()

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
            await self.release(reservation, called=True)

    async def _at_home(
        self, deployment: str, reservation: Reservation, affinity: str
    ) -> Reservation:
        every = self._replicas.get(deployment, [])
        home = home_of(affinity, every) if len(every) > 1 else None
        if (
            home is None
            or home is reservation.replica
            or home not in self._chooser(deployment, self._usable(deployment))
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
        """A slot on a replica of ``deployment``: tried at once, then polled for with pauses
        growing from 2 to 50 ms, until ``deadline`` (Unix s) or the pool's ``max_wait_s``."""
        if deployment not in self._replicas:
            raise KeyError(deployment)
        give_up = time.time() + self._max_wait_s
        if deadline is not None:
            give_up = min(give_up, deadline)
        try:
            return await until_reserved(
                lambda: self._reserve_one(deployment),
                stop=tenacity.stop_before_delay(give_up - time.time()),
            )
        except tenacity.RetryError:
            raise BackendUnavailable(f"{deployment}: no free slot on any replica") from None

    async def _reserve_one(self, deployment: str) -> Reservation | None:
        """A free slot on a replica of ``deployment``, or ``None`` when every one is busy."""
        if not self._replicas.get(deployment):
            raise BackendUnavailable(f"{deployment}: no replica is ready")
        try:
            return await self.reserve([deployment])
        except (RedisError, OSError) as exc:
            raise BackendUnavailable(f"{deployment}: slot leases unavailable: {exc}") from exc

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._leases is not None:
            self._renewer.start()

    async def _renew(self) -> None:
        assert self._leases is not None
        by_key: dict[str, list[tuple[str, str]]] = {}
        for key, lease_id in list(self._held.values()):
            by_key.setdefault(epoch_key_of(key), []).append((key, lease_id))
        for group in by_key.values():  # one script per tier: one Cluster slot each
            try:
                await self._leases.renew(group)
            except (RedisError, OSError) as exc:
                log.warning("cannot renew slot leases: %s", type(exc).__name__)

    async def aclose(self) -> None:
        await self._renewer.aclose()
        backends = [r.backend for group in self._replicas.values() for r in group]
        backends += [r.backend for r in self._retired]
        await asyncio.gather(*(b.aclose() for b in backends), return_exceptions=True)
