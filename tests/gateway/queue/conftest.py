"""Queue test harness: real Redis, simulator replicas as real HTTP servers, workers in-process.

``CountingSim`` wraps the simulator's app with a middleware that records the peak number of chat
requests it held at once: the number that must never exceed the replica's capacity.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from backends.openai_http import VLLMBackend
from backends.sim import PROFILES, create_sim_app
from gateway.accounting.records import LedgerEntry
from gateway.accounting.writer import LedgerWriter
from gateway.coalescer import CommandQueue, NoCoalescer
from gateway.faults.drain import InflightCalls
from gateway.faults.marks import NoStreamMarks
from gateway.observability.tracing import Tracing
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.notes import NoRunNotes
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor, PriceLookup
from gateway.queue.running.replying import AnswerStore, KeepsNoAnswers, LocalEdge, NoLocalEdge
from gateway.queue.running.worker import Worker
from router.catalog import Catalog, DeploymentSpec, Tier
from router.plan import RoutePlan

MODEL = "llama-3.1-8b-instruct"


class NoPrices:
    def cost(self, model: str, usage: object, at: float | None = None) -> None:
        return None

    def source(self, model: str, at: float | None = None) -> None:
        return None


def bare_executor(
    pool: BackendPool, catalog: Catalog, prices: PriceLookup | None = None, **parts: Any
) -> Executor:
    """An executor with no breaker, stream marks, run notes or tracing, but the ``parts``
    named (``Executor``'s keyword arguments)."""
    nothing: dict[str, Any] = {
        "stream_marks": NoStreamMarks(),
        "run_notes": NoRunNotes(),
        "tracing": Tracing.off(),
        "inflight": InflightCalls(),
    }
    return Executor(pool, prices or NoPrices(), catalog, {}, **{**nothing, **parts})


class Collect:
    """Stands in for the ledger writer: keeps what the workers book."""

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
class CountingSim:
    url: str
    capacity: int
    now: int = 0
    peak: int = 0
    served: list[str] = field(default_factory=list)


@pytest.fixture
async def redis_conn(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def start_sim() -> AsyncIterator[Callable[..., Awaitable[CountingSim]]]:
    runners: list[web.AppRunner] = []

    async def start(
        capacity: int, *, time_scale: float = 1.0, itl_s: float = 0.01, model: str = MODEL
    ) -> CountingSim:
        """A replica of ``model``'s profile (another's, e.g. ``gpt-4o-mini``: a hosted API)."""
        profile = dataclasses.replace(PROFILES[model], max_num_seqs=capacity, itl_s=itl_s)
        app = create_sim_app(profile, time_scale=time_scale)
        sim = CountingSim(url="", capacity=capacity)

        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path != "/v1/chat/completions":
                return await handler(request)
            sim.now += 1
            sim.peak = max(sim.peak, sim.now)
            try:
                return await handler(request)
            finally:
                sim.now -= 1
                sim.served.append(request.headers.get("x-request-id", ""))

        app.middlewares.append(count)
        # vLLM aborts a request whose client went away; handler cancellation does the same here.
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        sim.url = f"http://127.0.0.1:{port}"
        return sim

    yield start
    for runner in runners:
        await runner.cleanup()


@dataclass
class Node:
    """One worker process's parts: its pool (own lease owner id), executor, worker."""

    worker: Worker
    pool: BackendPool
    session: aiohttp.ClientSession

    async def aclose(self, drain_s: float = 10.0) -> None:
        await self.worker.aclose(drain_s=drain_s)
        await self.pool.aclose()
        await self.session.close()


async def start_node(
    redis: aioredis.Redis,
    keys: RedisKeys,
    sims: list[CountingSim],
    ledger: Collect | LedgerWriter,
    name: str,
    *,
    lease_ms: int = 30_000,
    batch_headroom: float = 0.1,
    reclaim_idle_s: float = 15.0,
    heartbeat_s: float = 2.0,
    local_edge: LocalEdge | None = None,
    answers: AnswerStore | None = None,
    coalescer: CommandQueue | None = None,
) -> Node:
    """``ledger``: a ``Collect``, or a real ``LedgerWriter`` (with ``coalescer``: the one it
    writes through, as ``tiergate serve`` wires them)."""
    session = aiohttp.ClientSession()
    replicas = [
        Replica(
            VLLMBackend(name=f"{MODEL}#{i}", base_url=sim.url, session=session),
            sim.capacity,
            slot_key=keys.slots("small", f"{MODEL}#{i}"),
        )
        for i, sim in enumerate(sims)
    ]
    pool = BackendPool({MODEL: replicas}, leases=SlotLeases(redis, lease_ms=lease_ms), owner=name)
    pool.start()
    catalog = Catalog((DeploymentSpec(model=MODEL, tier=Tier.SMALL, max_model_len=16384),))
    worker = Worker(
        redis=redis,
        blocking_redis=redis,
        keys=keys,
        executor=bare_executor(pool, catalog),
        ledger=ledger,
        capacity={},
        worker_id=name,
        claim_ttl_s=60,
        pool=pool,
        tiers={"small": [MODEL]},
        batch_headroom=batch_headroom,
        reclaim_idle_s=reclaim_idle_s,
        heartbeat_s=heartbeat_s,
        local_edge=local_edge or NoLocalEdge(),
        answers=answers or KeepsNoAnswers(),
        coalescer=coalescer or NoCoalescer(),
        tracing=Tracing.off(),
    )
    worker.start()
    return Node(worker, pool, session)


def job(
    request_id: str,
    edge: str,
    *,
    tenant: str = "acme",
    priority: str = "standard",
    timeout_s: float = 30.0,
    max_tokens: int = 8,
) -> Job:
    now = time.time()
    return Job(
        request_id=request_id,
        tenant=tenant,
        principal=tenant,
        reply_to=edge,
        plan=RoutePlan(tier=Tier.SMALL, deployments=(MODEL,), rule="pin:tier", reason="test"),
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


@dataclass
class Edge:
    dispatcher: Dispatcher
    replies: ReplyRouter
    edge_id: str

    async def call(self, j: Job) -> tuple[Reply, float]:
        """Submit and wait for the final reply; returns it and the queue wait (s) it reports."""
        stream = await self.dispatcher.submit(j)
        async for reply in stream:
            if reply.kind in ("result", "error", "end"):
                return reply, reply.meta.queue_ms / 1000
        raise AssertionError("no final reply")


@pytest.fixture
async def edge(redis_conn: aioredis.Redis, key_prefix: str) -> AsyncIterator[Edge]:
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("edge1"), block_ms=200)
    replies.start()
    dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=10_000, claim_ttl_s=60)
    yield Edge(dispatcher, replies, "edge1")
    await replies.aclose()


async def gather_calls(edge: Edge, jobs: list[Job]) -> list[tuple[Reply, float]]:
    return list(await asyncio.gather(*(edge.call(j) for j in jobs)))


def plan_job(*deployments: str, stream: bool = False, timeout_s: float = 30.0, **body: Any) -> Job:
    """A job (120 tokens at most) whose plan tries ``deployments`` in order; ``body``: more of
    the request's fields."""
    base = job(f"req_{uuid.uuid4().hex}", "edge1", max_tokens=120, timeout_s=timeout_s)
    plan = RoutePlan(tier=Tier.SMALL, deployments=deployments, rule="pin:tier", reason="test")
    return dataclasses.replace(base, plan=plan, stream=stream, body={**base.body, **body})


async def run_job(executor: Executor, j: Job) -> tuple[LedgerEntry, list[Reply]]:
    """``executor.run(j)``: its ledger entry and every reply it emitted."""
    replies: list[Reply] = []

    async def emit(reply: Reply) -> None:
        replies.append(reply)

    return await executor.run(j, emit), replies


def outcomes(entry: LedgerEntry) -> list[tuple[str, str]]:
    """The entry's attempts: (deployment, outcome), in order."""
    return [(a.deployment, a.outcome) for a in entry.attempts]


def reply_text(replies: list[Reply]) -> str:
    """The text the streamed chunks among ``replies`` carried."""
    return "".join(
        c["delta"].get("content") or ""
        for r in replies
        if r.kind == "chunk"
        for c in r.data.get("choices") or ()
    )
