"""The worker: take jobs from the tier queues, run them, send replies, book the ledger entry.

One ``Worker`` per process serves every tier. For each tier its take loop
(``gateway.queue.running.taking``) first reserves a slot on a replica of the tier
(``BackendPool.reserve``, global across processes), and only then takes a job
(``LaneQueue.take``: lanes by priority, tenants by fair share); the job's first backend call
uses that slot. Work beyond capacity therefore waits in Redis, not on the GPU servers. A tier
with no replica in the pool (no slot to reserve) is limited by a per-process count instead.

The edge of the same process may also hand a job over directly (``start_now``, see
``gateway.queue.running.direct``): when it would be taken at once anyway, it starts without waiting
in a stream, and its replies go straight to the waiter instead of through the reply stream.

A worker that holds a reserved slot and finds nothing to take is registered as idle by the take
script and blocks on its own wake list and the tier's bell: an edge (of any process) whose job
need not wait hands it over on the wake list, claim taken (``gateway.queue.lanes``), so the
worker starts it without a take or a claim of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.accounting.records import LedgerEntry
from gateway.coalescer import CommandQueue
from gateway.loops import Loop
from gateway.observability.tracing import Tracing
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue, Taken, lane_of
from gateway.queue.ownership.cancels import CancelListener, EarlyCancels
from gateway.queue.ownership.claims import Reclaimed, WorkerClaims
from gateway.queue.ownership.reclaim import Reclaimer
from gateway.queue.ownership.table import Verdict
from gateway.queue.replicas.pool import BackendPool, Reservation
from gateway.queue.running.direct import DirectStart
from gateway.queue.running.executor import Executor
from gateway.queue.running.finish import EntryWriter, Finisher
from gateway.queue.running.replying import AnswerStore, Deliver, LocalEdge, ReplySender
from gateway.queue.running.service_times import ServiceTimes
from gateway.queue.running.taking import TakeLoop
from gateway.tasks import stop_tasks

__all__ = ["Deliver", "Worker"]

log = logging.getLogger(__name__)

_HEARTBEAT_S = 2.0


def _not_reclaimed(tier: str, exc: BaseException) -> None:
    log.warning("worker cannot reclaim in %s: %s", tier, type(exc).__name__)


def _no_heartbeat(exc: BaseException) -> None:
    # Sent again in heartbeat_s (the take loop warns of a Redis that fails); the keys live for
    # three beats, so one failed beat lets no other worker take this one's jobs over.
    log.debug("worker heartbeat not sent: %s", type(exc).__name__)


class Worker:
    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        blocking_redis: aioredis.Redis,
        keys: RedisKeys,
        executor: Executor,
        ledger: EntryWriter,
        capacity: Mapping[str, int],
        worker_id: str,
        claim_ttl_s: int,
        pool: BackendPool,
        answers: AnswerStore,
        coalescer: CommandQueue,
        tracing: Tracing,
        local_edge: LocalEdge,
        tiers: Mapping[str, Sequence[str]] | None = None,
        batch_headroom: float = 0.1,
        reclaim_idle_s: float = 15.0,
        heartbeat_s: float = _HEARTBEAT_S,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        """``pool``: the replicas it reserves slots on (``BackendPool({})``: none);
        ``answers``: where a keyed job's final reply is kept for its repeats (``Idempotency``,
        or ``KeepsNoAnswers``); ``coalescer``: where acknowledgements are queued instead of a
        round trip each (``NoCoalescer``: none is); ``tracing``: ``Tracing.off()`` for none;
        ``local_edge``: the edge in this process, whose jobs' replies are handed over in memory
        rather than through its reply stream (``EdgeBeside``, or ``NoLocalEdge``).
        ``capacity``: per-process slots of each tier that has no replica in ``pool``;
        ``tiers``: each tier's deployments, in order; ``batch_headroom``: share of a tier's
        slots batch work may not take; ``reclaim_idle_s``: how long a job's entry may go
        unrenewed before another worker reclaims it (its worker is presumed dead); ``weights``:
        tenants' fair-share weights, for the jobs it starts at once (read at each start: a live
        view, ``TenantDirectory.weights``)."""
        self._redis = redis
        self._blocking = blocking_redis
        self._keys = keys
        self._executor = executor
        self._pool = pool
        self._tiers = {t: [d for d in deps if d in self._pool] for t, deps in (tiers or {}).items()}
        self._capacity = {tier: n for tier, n in capacity.items() if n > 0}
        for tier, deps in self._tiers.items():
            if deps:  # the pool's replicas may come and go (discovery): read at each use
                self._capacity[tier] = max(sum(self._pool.capacity(d) for d in deps), 1)
        self._headroom = batch_headroom
        self._lanes = LaneQueue(redis, keys, coalescer=coalescer)
        self._direct = DirectStart(redis, keys)
        self._weights: Mapping[str, float] = weights if weights is not None else {}
        self.worker_id = worker_id
        self._taking: list[asyncio.Task[None]] = []
        """Per tier, the take loop and the reclaim loop: stopped by ``stop_taking``."""
        self._keeping: list[asyncio.Task[None]] = []
        """The heartbeat and the entries' renewal (and ``_cancels``, the cancel listener):
        they keep what this worker runs its own, so they go on through the drain, until
        ``aclose`` has no job left (a lapsed heartbeat would let another worker take a running
        job over; an unheard cancel, run a job for a client that has gone)."""
        self._jobs: set[asyncio.Task[None]] = set()
        self._service_times = ServiceTimes(redis, keys)
        self._heartbeat_s = heartbeat_s
        self._reclaim_idle_s = reclaim_idle_s
        self._reclaimer = Reclaimer(redis, keys, min_idle_ms=int(reclaim_idle_s * 1000))
        self._active: set[Taken] = set()
        self._running: dict[str, asyncio.Task[None]] = {}
        """Request id -> the task running its executor (what a cancel stops)."""
        self._cancels = CancelListener(blocking_redis, keys.cancels, self.cancel)
        self._early_cancels = EarlyCancels()
        """Cancels that named no job running here: one started at once whose task has not run
        yet, or one whose claim this worker won but has not registered (``cancels.py``)."""
        self._stopping = False
        self._closed = False
        self._tracing = tracing
        self._claims = WorkerClaims(
            redis, keys, self._reclaimer, worker_id=worker_id, ttl_s=claim_ttl_s
        )
        self._replies = ReplySender(redis, keys, answers=answers, local_edge=local_edge)
        self._finisher = Finisher(
            redis=redis,
            ledger=ledger,
            claims=self._claims,
            replies=self._replies,
            lanes=self._lanes,
            coalescer=coalescer,
        )

    def start(self) -> None:
        for tier, slots in self._capacity.items():
            taking = TakeLoop(
                tier,
                deployments=self._tiers.get(tier, []),
                slots=slots,
                worker_id=self.worker_id,
                pool=self._pool,
                lanes=self._lanes,
                blocking=self._blocking,
                batch_limit=self._batch_limit,
                spawn=self._spawn,
            )
            self._taking.append(asyncio.create_task(taking.run(), name=taking.name))
            reclaim = Loop(
                f"tiergate-reclaim-{tier}",
                functools.partial(self._reclaim, tier),
                every_s=self._reclaim_idle_s / 2,
                catch=(RedisError, OSError),
                on_error=functools.partial(_not_reclaimed, tier),
            )
            self._taking.append(asyncio.create_task(reclaim.run(), name=reclaim.name))
        heartbeat = Loop(
            "tiergate-heartbeat",
            self._heartbeat,
            every_s=self._heartbeat_s,
            catch=(RedisError, OSError),
            on_error=_no_heartbeat,
        )
        renewal = Loop(
            "tiergate-renew-entries",
            self._renew,
            every_s=self._reclaim_idle_s / 3,
            pause_first=True,
        )
        self._keeping.extend(
            asyncio.create_task(loop.run(), name=loop.name) for loop in (heartbeat, renewal)
        )
        self._cancels.start()

    @property
    def running(self) -> int:
        return len(self._jobs)

    def _batch_limit(self, tier: str, slot_keys: Sequence[str]) -> int:
        deps = self._tiers.get(tier)
        slots = sum(self._pool.capacity(d) for d in deps) if deps else self._capacity.get(tier, 0)
        return max(math.floor(slots * (1 - self._headroom)), 1) if slot_keys else -1

    async def start_now(self, job: Job, deliver: Deliver) -> bool:
        """Start ``job`` in this process at once if it would be the next job taken and its
        first deployment has a free slot; ``False``: queue it. Redis errors propagate."""
        first = job.plan.deployments[0] if job.plan.deployments else None
        tier = job.plan.tier.value
        if self._stopping or first is None or first not in self._tiers.get(tier, ()):
            return False
        lease_ms = self._pool.lease_ms
        replicas = self._pool.ranked(first, affinity=job.conversation)
        if lease_ms is None or not replicas:
            return False
        lease_id = self._pool.new_lease_id()
        started = await self._direct.start(
            tier=tier,
            lane=lane_of(job.priority),
            tenant=job.tenant,
            job=job.encode(),
            weight=self._weights.get(job.tenant, 1.0),
            consumer=self.worker_id,
            slots=[(r.slot_key, r.capacity) for r in replicas],
            lease_id=lease_id,
            lease_ms=lease_ms,
            batch_limit=self._batch_limit(tier, self._pool.slot_keys(self._tiers[tier])),
        )
        if started is None:
            return False
        reservation = self._pool.adopt(first, replicas[started.slot], lease_id)
        task = asyncio.create_task(
            self._handle(started.taken, reservation, None, job=job, deliver=deliver)
        )
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        return True

    def cancel(self, request_id: str) -> bool:
        """Stop a job of this process whose client went away; ``False`` if none runs here.
        It ends with outcome ``client_disconnected``, booked with the tokens produced."""
        task = self._running.get(request_id)
        if task is None:
            # It may be about to run here (started at once, its task not run yet; or its claim
            # won, not yet registered): it ends before its first call when it does.
            self._early_cancels.hear(request_id)
            return False
        if task.done():
            return False
        self._executor.abandon(request_id)
        task.cancel()
        return True

    async def stop_taking(self) -> None:
        """Stop taking new jobs; the ones running go on."""
        self._stopping = True
        await stop_tasks(self._taking)
        self._taking.clear()
        for tier in self._capacity:
            try:
                handed = await self._lanes.withdraw(tier, self.worker_id)
            except (RedisError, OSError) as exc:
                # Anything handed over meanwhile is reclaimed once our heartbeat is gone.
                log.warning("worker cannot withdraw from %s: %s", tier, type(exc).__name__)
                continue
            for taken in handed:  # handed over before we stopped: run it within the grace
                self._spawn(taken, None, None)

    async def aclose(self, *, drain_s: float = 10.0) -> None:
        """Graceful stop: take no new job, let running ones finish within ``drain_s``, hand back
        the rest (unacknowledged, claim released: another worker reclaims them). Once: a
        second call (the services' own close after the server's drain) does nothing."""
        if self._closed:
            return
        self._closed = True
        await self.stop_taking()
        if self._jobs:
            _done, pending = await asyncio.wait(self._jobs, timeout=drain_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        await stop_tasks(self._keeping)
        self._keeping.clear()
        await self._cancels.aclose()
        with contextlib.suppress(RedisError, OSError):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in self._heartbeat_keys():  # in different slots: one DEL each
                    pipe.delete(key)
                await pipe.execute()

    def _heartbeat_keys(self) -> list[str]:
        """One for readiness, one per tier for the reclaim scripts (each in its tier's slot)."""
        k = self._keys
        return [
            k.worker_heartbeat(self.worker_id),
            *(k.tier_heartbeat(tier, self.worker_id) for tier in self._capacity),
        ]

    async def _heartbeat(self) -> None:
        """Say this worker is alive (every ``heartbeat_s``; the keys live three times that)."""
        tiers = ",".join(self._capacity)
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in self._heartbeat_keys():
                pipe.set(key, tiers, px=int(self._heartbeat_s * 3000))
            await pipe.execute()

    async def _renew(self) -> None:
        """Keep the entries of running jobs fresh, so nobody reclaims a job that is alive
        (every ``reclaim_idle_s / 3``)."""
        by_stream: dict[str, list[bytes]] = {}
        for taken in list(self._active):
            stream = self._keys.jobs(taken.tier, taken.lane, taken.tenant)
            by_stream.setdefault(stream, []).append(taken.entry_id)
        for stream, ids in by_stream.items():
            with contextlib.suppress(RedisError, OSError):  # one stream's failure, not all
                await self._reclaimer.touch(stream, self.worker_id, ids)

    async def _reclaim(self, tier: str) -> None:
        """Take over jobs whose worker died: entries idle past ``reclaim_idle_s``; a first look
        at once (a worker that starts is often the replacement of one that died), then every
        ``reclaim_idle_s / 2``."""
        deployments = self._tiers.get(tier, [])
        tag = self._keys.tier_tag(tier) + ":jobs:"
        for stream in await self._reclaimer.streams(tier):
            while True:
                reservation = await self._pool.reserve(deployments) if deployments else None
                if deployments and reservation is None:
                    break  # no free slot now; try again next round
                orphans = await self._reclaimer.orphans(stream, self.worker_id)
                if not orphans:
                    if reservation is not None:
                        await self._pool.release(reservation)
                    break
                lane, _, tenant = stream.removeprefix(tag).partition(":")
                entry_id, fields = orphans[0]
                taken = Taken(tier, lane, tenant, entry_id, fields.get(b"j", b""))
                log.warning("reclaiming job %s of %s", entry_id, stream)
                started_by = fields.get(b"o", b"").decode()
                self._spawn(taken, reservation, None, reclaimed=Reclaimed(started_by))

    def _spawn(
        self,
        taken: Taken,
        reservation: Reservation | None,
        local: asyncio.Semaphore | None,
        *,
        reclaimed: Reclaimed | None = None,
    ) -> None:
        task = asyncio.create_task(self._handle(taken, reservation, local, reclaimed=reclaimed))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _handle(
        self,
        taken: Taken,
        reservation: Reservation | None,
        local: asyncio.Semaphore | None,
        *,
        reclaimed: Reclaimed | None = None,
        job: Job | None = None,
        deliver: Deliver | None = None,
    ) -> None:
        """Run a taken job. ``reclaimed``: taken over from a worker presumed dead. ``job`` and
        ``deliver``: a job started at once (``start_now``), already owned, answering its waiter
        directly. A job handed over by an enqueue (``taken.claimed``) is owned too: it runs like
        one started at once (its deadline is left to the backend timeouts), answering through
        the reply stream.

        The run's final reply is held back until its row is booked and its entry acknowledged
        (``Finisher.finish``): a worker that dies before that has answered nothing, and the job runs
        again; one that dies after has booked what its client gets, and is never run again."""
        ack = True
        finished = False
        self._active.add(taken)
        try:
            if reservation is not None:  # the slot held in wait now runs a job
                reservation = await self._pool.busy(reservation)
            if job is None:
                job, ack = await self._accept(taken, reclaimed)
                if job is None:
                    return
            self._tracing.adopt(job)  # this task's spans join the job's trace
            send = self._replies.emitter(job, deliver)
            held: list[Reply] = []

            async def emit(reply: Reply) -> None:
                if reply.kind == "chunk" or held:
                    await send(reply)
                else:
                    held.append(reply)  # the answer: sent once booked

            started = time.time()
            run = functools.partial(
                self._executor.run,
                job,
                emit,
                reclaimed=reclaimed is not None,
                local=deliver is not None,
            )
            holding, reservation = reservation, None  # released by ``_run`` from here on
            entry = await self._run(job, run, holding)
            answer = held[0] if held else None
            entry, answer = self._finisher.replies_lost(job, entry, answer)
            finished = await self._finisher.finish(taken, job, entry, answer, send, deliver)
            await self._service_times.note(taken.tier, time.time() - started)
        except asyncio.CancelledError:
            # Shutting down past the grace period: hand the job back (no ack, claim released).
            ack = False
            if job is not None and not finished:
                with contextlib.suppress(RedisError, OSError):
                    await self._claims.release(taken.tier, job)
            raise
        except Exception:
            log.exception("job %s failed in the worker", taken.entry_id)
        finally:
            self._active.discard(taken)
            if reservation is not None:
                await self._pool.release(reservation)
            if local is not None:
                local.release()
            if ack and not finished:
                with contextlib.suppress(RedisError, OSError):
                    await self._lanes.ack(taken)

    async def _run(
        self,
        job: Job,
        run: Callable[[], Awaitable[LedgerEntry]],
        reservation: Reservation | None,
    ) -> LedgerEntry:
        """``run()`` on ``reservation``'s slot, cancellable by the job's request id."""
        task = asyncio.current_task()
        assert task is not None
        self._running[job.request_id] = task
        if self._early_cancels.take(job.request_id):
            self._executor.abandon(job.request_id)  # it ends before its first call
        try:
            if reservation is None:
                return await run()
            async with self._pool.holding(reservation):
                return await run()
        finally:
            self._running.pop(job.request_id, None)

    async def _accept(self, taken: Taken, reclaimed: Reclaimed | None) -> tuple[Job | None, bool]:
        """The job of ``taken`` if this worker is to run it; else ``None``, and whether to
        acknowledge its entry (dropped) or to leave it (the worker that runs it lives)."""
        try:
            job = Job.decode(taken.job)
        except (KeyError, ValueError, TypeError) as exc:
            log.error("dropping malformed job %s: %s", taken.entry_id, exc)
            return None, True
        if taken.claimed:
            return job, True  # handed over by an enqueue, claim taken for us
        if reclaimed is None and self._service_times.too_late(taken.tier, job):
            await self._lanes.not_started(taken)
            return None, True  # left to the edge, which answers 504 at the deadline
        verdict = await self._claims.own(taken.tier, job, reclaimed)
        if verdict is Verdict.RUN:
            return job, True
        if verdict is Verdict.ANSWERED_BY_EDGE and reclaimed is not None:
            return None, not await self._book_noted(taken, job)
        if verdict is Verdict.ALREADY_FINISHED:
            log.warning("dropping job %s: already booked and answered", taken.entry_id)
            return None, True
        if verdict is not Verdict.OWNER_ALIVE:
            await self._lanes.not_started(taken)
            return None, True
        return None, False  # its worker lives (slow renewal): leave it

    async def _book_noted(self, taken: Taken, job: Job) -> bool:
        """A job whose claim the edge took after a run handed it back (its claim released,
        then taken by the edge: its deadline passed, or its client left). The edge booked the
        calls that run noted and deleted the note (``gateway.queue.ownership.edge_booking``); a note
        still here means it could not, and the calls are booked here (``Executor.noted``; the ledger
        keeps a request's first entry). Whether the acknowledgement went out with the entry."""
        entry = await self._executor.noted(job)
        return entry is not None and await self._finisher.book(taken, entry)
