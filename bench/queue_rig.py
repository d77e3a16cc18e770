"""Shared rig for the queue benches: simulator replicas (real HTTP, with a middleware counting
the requests each holds at once), worker "processes" (own pools and lease owners, one Redis),
and an edge dispatcher, all in this process. Not a test helper: imported by bench scripts only.

Like ``tiergate serve``, each worker queues its slot releases and acknowledgements on a
``Coalescer`` (one pipeline per loop turn) instead of awaiting a round trip for each."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Handler

from backends.openai_http import VLLMBackend
from backends.sim import PROFILES, create_sim_app
from gateway.accounting.records import LedgerEntry
from gateway.coalescer import Coalescer
from gateway.faults.drain import InflightCalls
from gateway.faults.marks import NoStreamMarks
from gateway.observability.tracing import Tracing
from gateway.queue.edge.deadline import DeadlineAdmission
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.edge.snapshot import QueueSnapshot, TierQueue
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.notes import NoRunNotes
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from gateway.queue.running.replying import EdgeBeside, KeepsNoAnswers, LocalEdge, NoLocalEdge
from gateway.queue.running.worker import Worker
from router.catalog import Catalog, DeploymentSpec, Tier
from router.plan import RoutePlan

MODEL = "llama-3.1-8b-instruct"


class NoPrices:
    def cost(self, model: str, usage: object, at: float | None = None) -> None:
        return None

    def source(self, model: str, at: float | None = None) -> None:
        return None


class Books:
    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []

    async def write(
        self,
        entry: LedgerEntry,
        *,
        then: Callable[[], None] | None = None,
        sql_fallback: bool = True,
    ) -> None:
        self.entries.append(entry)
        if then is not None:
            then()


@dataclass
class Sim:
    url: str
    capacity: int
    now: int = 0
    peak: int = 0
    runner: web.AppRunner | None = None


async def start_sim(capacity: int, *, time_scale: float, itl_s: float) -> Sim:
    profile = dataclasses.replace(PROFILES[MODEL], max_num_seqs=capacity, itl_s=itl_s)
    app = create_sim_app(profile, time_scale=time_scale)
    sim = Sim(url="", capacity=capacity)

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/v1/chat/completions":
            return await handler(request)
        sim.now += 1
        sim.peak = max(sim.peak, sim.now)
        try:
            return await handler(request)
        finally:
            sim.now -= 1

    app.middlewares.append(count)
    # vLLM aborts a request whose client went away; handler cancellation does the same here.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sim.url = f"http://127.0.0.1:{port}"
    sim.runner = runner
    return sim


EDGE_ID = "bench-edge"


@dataclass
class Rig:
    redis: aioredis.Redis
    keys: RedisKeys
    sims: list[Sim]
    workers: list[Worker] = field(default_factory=list)
    pools: list[BackendPool] = field(default_factory=list)
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)
    coalescers: list[Coalescer] = field(default_factory=list)
    books: Books = field(default_factory=Books)
    replies: ReplyRouter | None = None
    dispatcher: Dispatcher | None = None
    snapshot: QueueSnapshot | None = None

    def edge_replies(self) -> ReplyRouter:
        """The edge's reply channel (made once; read once the edge starts)."""
        if self.replies is None:
            self.replies = ReplyRouter(self.redis, self.keys.replies(EDGE_ID), block_ms=200)
        return self.replies

    async def add_worker(
        self, name: str, *, batch_headroom: float = 0.1, beside_edge: bool = False
    ) -> Worker:
        """``beside_edge``: the worker shares the edge's process, as in ``tiergate serve``,
        and hands that edge's replies over in memory; else it answers through the edge's reply
        stream, as a worker of another process does."""
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        replicas = [
            Replica(
                VLLMBackend(name=f"{MODEL}#{i}", base_url=s.url, session=session),
                s.capacity,
                slot_key=self.keys.slots("small", f"{MODEL}#{i}"),
            )
            for i, s in enumerate(self.sims)
        ]
        coalescer = Coalescer(self.redis)
        leases = SlotLeases(self.redis, coalescer=coalescer)
        pool = BackendPool({MODEL: replicas}, leases=leases, owner=name)
        pool.start()
        catalog = Catalog((DeploymentSpec(model=MODEL, tier=Tier.SMALL, max_model_len=16384),))
        local_edge: LocalEdge = (
            EdgeBeside(EDGE_ID, self.edge_replies()) if beside_edge else NoLocalEdge()
        )
        worker = Worker(
            redis=self.redis,
            blocking_redis=self.redis,
            keys=self.keys,
            executor=Executor(
                pool,
                NoPrices(),
                catalog,
                {},
                stream_marks=NoStreamMarks(),
                tracing=Tracing.off(),
                inflight=InflightCalls(),
                run_notes=NoRunNotes(),
            ),
            ledger=self.books,
            capacity={},
            worker_id=name,
            claim_ttl_s=60,
            pool=pool,
            tiers={"small": [MODEL]},
            batch_headroom=batch_headroom,
            answers=KeepsNoAnswers(),
            coalescer=coalescer,
            tracing=Tracing.off(),
            local_edge=local_edge,
        )
        worker.start()
        self.workers.append(worker)
        self.pools.append(pool)
        self.sessions.append(session)
        self.coalescers.append(coalescer)
        return worker

    def start_edge(
        self,
        *,
        max_depth: int,
        local: Worker | None = None,
        deadline_admission: bool = False,
        deadline_margin: float = 0.1,
    ) -> None:
        """``local``: a worker of the edge's own process, which starts jobs at once when they
        need not wait (``queue.direct_start``); ``deadline_admission``: refuse at once what is
        not expected to start before its deadline (``queue.deadline_admission``), from a queue
        snapshot refreshed as ``tiergate serve`` does."""
        self.edge_replies().start()
        deadline = None
        if deadline_admission:
            slot_keys = tuple(
                self.keys.slots("small", f"{MODEL}#{i}") for i in range(len(self.sims))
            )
            tier = TierQueue(
                capacity=sum(s.capacity for s in self.sims),
                slot_keys=slot_keys,
                slot_deployments=tuple(MODEL for _ in slot_keys),
                deployment_capacity={MODEL: sum(s.capacity for s in self.sims)},
            )
            self.snapshot = QueueSnapshot(self.redis, self.keys, {"small": tier})
            self.snapshot.start()
            deadline = DeadlineAdmission(self.snapshot.view, margin=deadline_margin)
        self.dispatcher = Dispatcher(
            self.redis,
            self.keys,
            self.edge_replies(),
            max_depth=max_depth,
            claim_ttl_s=60,
            local=local,
            deadline=deadline,
        )

    async def close(self) -> None:
        if self.snapshot is not None:
            await self.snapshot.aclose()
        for w in self.workers:
            await w.aclose(drain_s=30)
        for p in self.pools:
            await p.aclose()
        for c in self.coalescers:
            await c.aclose()
        for s in self.sessions:
            await s.close()
        if self.replies is not None:
            await self.replies.aclose()
        for sim in self.sims:
            if sim.runner is not None:
                await sim.runner.cleanup()
        async for key in self.redis.scan_iter(match=f"{self.keys.prefix}:*", count=1000):
            await self.redis.delete(key)
        await self.redis.aclose()


async def make_rig(
    redis_url: str, *, replicas: int, capacity: int, time_scale: float, itl_s: float
) -> Rig:
    redis = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"bench-{uuid.uuid4().hex[:8]}")
    sims = [await start_sim(capacity, time_scale=time_scale, itl_s=itl_s) for _ in range(replicas)]
    return Rig(redis, keys, sims)


def make_job(
    request_id: str, *, tenant: str, priority: str, timeout_s: float, max_tokens: int
) -> Job:
    now = time.time()
    return Job(
        request_id=request_id,
        tenant=tenant,
        principal=tenant,
        reply_to="bench-edge",
        plan=RoutePlan(tier=Tier.SMALL, deployments=(MODEL,), rule="pin:tier", reason="bench"),
        body={
            "model": MODEL,
            "messages": [{"role": "user", "content": f"hello {request_id}"}],
            "max_tokens": max_tokens,
        },
        stream=False,
        enqueued_at=now,
        deadline=now + timeout_s,
        received_at=now,
        priority=priority,
    )


async def final_reply(dispatcher: Dispatcher, job: Job) -> Reply:
    stream = await dispatcher.submit(job)
    async for reply in stream:
        if reply.kind in ("result", "error", "end"):
            return reply
    raise RuntimeError("stream ended without a final reply")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def sample_peak(rig: Rig, stop: asyncio.Event, out: dict[str, int]) -> None:
    """Also watch the global lease count per replica (what Redis says is in flight)."""
    leases = SlotLeases(rig.redis)
    keys = [rig.keys.slots("small", f"{MODEL}#{i}") for i in range(len(rig.sims))]
    while not stop.is_set():
        for key, held in zip(keys, await leases.held(keys), strict=True):
            out[key] = max(out.get(key, 0), held)
        await asyncio.sleep(0.05)
