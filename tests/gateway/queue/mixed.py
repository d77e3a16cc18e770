"""A worker serving a vLLM deployment (tier ``small``) and a hosted API (tier ``external``:
litellm, the simulator in its OpenAI flavour), with stream marks and run notes on, as
``tiergate serve`` wires it; and the ledger's real path for what it books (the event stream, the
sink, SQLite). Used in-process and by ``mixed_worker_proc`` (a worker process to kill).

litellm is imported when the first node is built (it takes seconds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from sqlalchemy import text

from backends.litellm_backend import LiteLLMBackend
from backends.openai_http import VLLMBackend
from gateway.accounting.dead_letters import DeadLetters
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import Price, PriceBook
from gateway.accounting.records import LedgerEntry
from gateway.accounting.sink import LedgerSink
from gateway.accounting.writer import LedgerWriter
from gateway.coalescer import NoCoalescer
from gateway.faults.marks import StreamMarks
from gateway.observability.tracing import Tracing
from gateway.queue.billing import Billing
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.jobs import Job
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.edge_booking import NotedBooking
from gateway.queue.ownership.notes import CallNotes, NoRunNotes, RunNotes
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from gateway.queue.running.replying import KeepsNoAnswers, NoLocalEdge
from gateway.queue.running.worker import Worker
from router.catalog import Catalog, DeploymentSpec, Tier
from router.features import PromptFeatures
from router.plan import RoutePlan
from tests.gateway.queue.conftest import MODEL, Collect, CountingSim, Edge, Node, bare_executor, job
from tests.support import value_when

HOSTED = "gpt-4o-mini"
PRICES = {
    HOSTED: Price.per_mtok(Decimal("0.15"), Decimal("0.60")),
    MODEL: Price.per_mtok(Decimal("0.03"), Decimal("0.06")),
}
CATALOG = Catalog(
    (
        DeploymentSpec(model=MODEL, tier=Tier.SMALL, max_model_len=16384),
        DeploymentSpec(model=HOSTED, tier=Tier.EXTERNAL, max_model_len=128_000, provider="litellm"),
    )
)
CLAIM_TTL_S = 60


def executor(
    redis: aioredis.Redis, keys: RedisKeys, pool: BackendPool, *, notes: bool = True
) -> Executor:
    run_notes: CallNotes = RunNotes(redis, keys, keep_s=CLAIM_TTL_S) if notes else NoRunNotes()
    return bare_executor(
        pool,
        CATALOG,
        PriceBook(PRICES),
        stream_marks=StreamMarks(redis, keys.prefix),
        run_notes=run_notes,
    )


def mixed_pool(
    redis: aioredis.Redis,
    keys: RedisKeys,
    vllm_url: str,
    hosted_url: str,
    session: aiohttp.ClientSession,
    owner: str,
    *,
    lease_ms: int = 30_000,
    capacity: int = 2,
) -> BackendPool:
    external = LiteLLMBackend(
        f"{HOSTED}#0", f"openai/{HOSTED}", api_base=f"{hosted_url}/v1", api_key="sk-test",
        session=session,
    )  # fmt: skip
    local = VLLMBackend(name=f"{MODEL}#0", base_url=vllm_url, session=session)
    pool = BackendPool(
        {
            HOSTED: [Replica(external, capacity, slot_key=keys.slots("external", f"{HOSTED}#0"))],
            MODEL: [Replica(local, capacity, slot_key=keys.slots("small", f"{MODEL}#0"))],
        },
        leases=SlotLeases(redis, lease_ms=lease_ms),
        owner=owner,
    )
    pool.start()
    return pool


async def start_mixed_node(
    redis: aioredis.Redis,
    keys: RedisKeys,
    vllm_url: str,
    hosted_url: str,
    ledger: LedgerWriter | Collect,
    name: str,
    *,
    lease_ms: int = 30_000,
    reclaim_idle_s: float = 1.5,
    heartbeat_s: float = 0.3,
) -> Node:
    session = aiohttp.ClientSession()
    pool = mixed_pool(redis, keys, vllm_url, hosted_url, session, name, lease_ms=lease_ms)
    worker = Worker(
        redis=redis,
        blocking_redis=redis,
        keys=keys,
        executor=executor(redis, keys, pool),
        ledger=ledger,
        capacity={},
        worker_id=name,
        claim_ttl_s=CLAIM_TTL_S,
        pool=pool,
        answers=KeepsNoAnswers(),
        coalescer=NoCoalescer(),
        tracing=Tracing.off(),
        local_edge=NoLocalEdge(),
        tiers={"small": [MODEL], "external": [HOSTED]},
        reclaim_idle_s=reclaim_idle_s,
        heartbeat_s=heartbeat_s,
    )
    worker.start()
    return Node(worker, pool, session)


def mixed_job(
    request_id: str,
    deployments: tuple[str, ...],
    *,
    stream: bool = False,
    max_tokens: int = 16,
    timeout_s: float = 60.0,
) -> Job:
    """A job whose plan is ``deployments`` in order, in the tier of the first."""
    spec = CATALOG.get(deployments[0])
    assert spec is not None
    tier = spec.tier
    plan = RoutePlan(tier=tier, deployments=deployments, rule="pin:tier", reason="test")
    base = job(request_id, "edge1", max_tokens=max_tokens, timeout_s=timeout_s)
    return dataclasses.replace(base, plan=plan, stream=stream)


def booking_edge(redis: aioredis.Redis, keys: RedisKeys, writer: LedgerWriter) -> Edge:
    """An edge ``edge1`` as ``tiergate serve`` wires it (its reply reader started): it books what
    it takes over from a run's note. Close its ``replies`` at the end."""
    replies = ReplyRouter(redis, keys.replies("edge1"), block_ms=200)
    replies.start()
    billing = Billing(PriceBook(PRICES), CATALOG, {})
    dispatcher = Dispatcher(
        redis,
        keys,
        replies,
        max_depth=10_000,
        claim_ttl_s=CLAIM_TTL_S,
        noted=NotedBooking(redis, keys, billing, writer),
    )
    return Edge(dispatcher, replies, "edge1")


def edge_estimate(the_job: Job) -> int:
    """The prompt estimate the edge reserved budgets with, and a hosted call is booked."""
    return PromptFeatures.from_messages(the_job.body["messages"]).estimated_prompt_tokens


async def set_faults(sim: CountingSim, **faults: Any) -> None:
    """Replace the simulator's faults (none: clear them)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sim.url}/admin/faults", json=faults) as response,
    ):
        assert response.status == 200, await response.text()


@dataclass
class Books:
    """The ledger as the gateway writes it: writer ▸ event stream ▸ sink ▸ SQLite."""

    writer: LedgerWriter
    sink: LedgerSink
    ledger: SqlLedger

    @classmethod
    async def open(cls, redis: aioredis.Redis, keys: RedisKeys, path: Path) -> Books:
        ledger = await SqlLedger.connect(f"sqlite+aiosqlite:///{path}")
        writer = LedgerWriter(redis, keys.ledger_events, ledger)
        sink = LedgerSink(
            redis=redis,
            blocking_redis=redis,
            stream=keys.ledger_events,
            group=keys.ledger_group,
            consumer="sink",
            ledger=ledger,
            dead_letters=DeadLetters(ledger.engine),
            dead_letter_stream=keys.ledger_dead_letters,
        )
        return cls(writer, sink, ledger)

    async def row(self, request_id: str, timeout_s: float = 10.0) -> LedgerEntry:
        """The request's row, once the sink has booked it."""

        async def read() -> LedgerEntry | None:
            await self.sink.drain()
            return await self.ledger.get(request_id)

        entry = await value_when(
            read, lambda found: found is not None, timeout_s, what=f"no ledger row for {request_id}"
        )
        assert entry is not None
        return entry

    async def count(self) -> int:
        """Rows booked (every event drained first)."""
        await self.sink.drain()
        async with self.ledger.engine.connect() as conn:
            return int((await conn.execute(text("SELECT count(*) FROM ledger_entries"))).scalar())

    async def aclose(self) -> None:
        await self.ledger.aclose()
