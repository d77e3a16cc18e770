"""A job handed back at shutdown with its calls noted, whose edge takes its claim before any
worker takes it over: its client left (before the first reply, or mid-stream), or its deadline
passed. The edge books the request's one row from the note at once — the noted calls, final —
and the budget settles once at their cost; a worker that finds the job later books nothing more.

Real Redis; the handed-back job runs against simulators over HTTP (the hosted API through
litellm), and its row goes the ledger's real path (writer, event stream, sink, SQLite), with a
budget reserved and settled on the real Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.accounting.budgets import BudgetBook
from gateway.accounting.prices import PriceBook
from gateway.accounting.records import Attempt
from gateway.accounting.writer import LedgerWriter
from gateway.api.booking import Refusal, book_refusal
from gateway.api.edge import _abandoned
from gateway.api.relay import RelayedError
from gateway.auth.principals import Principal
from gateway.errors import ClientDisconnected, GatewayError, ServiceUnavailable
from gateway.metrics import Metrics
from gateway.observability.tracing import Tracing
from gateway.queue.billing import Billing
from gateway.queue.edge.dispatcher import EDGE_CLAIM, Dispatcher
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.edge_booking import NotedBooking
from gateway.queue.ownership.notes import RunNote
from gateway.queue.replicas.pool import BackendPool
from gateway.settings import BudgetSettings
from tests.gateway.queue.conftest import MODEL, CountingSim, Edge
from tests.gateway.queue.mixed import (
    CATALOG,
    CLAIM_TTL_S,
    HOSTED,
    PRICES,
    Books,
    booking_edge,
    executor,
    mixed_job,
    set_faults,
    start_mixed_node,
)
from tests.gateway.queue.test_reclaimed_attempts import budget_cost, calls, cost
from tests.support import until

pytestmark = pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211"
)

PRINCIPAL = Principal(name="acme", roles=frozenset({"tenant:acme"}))


@pytest.fixture
async def books(
    redis_conn: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> AsyncIterator[Books]:
    opened = await Books.open(redis_conn, RedisKeys(key_prefix), tmp_path / "ledger.db")
    yield opened
    await opened.aclose()


@pytest.fixture
def budgets(redis_conn: aioredis.Redis, key_prefix: str) -> BudgetBook:
    return BudgetBook(
        redis_conn,
        key_prefix,
        {"acme": (BudgetSettings(name="m", limit_usd="10"),)},
        prices=PriceBook(PRICES),
    )


@pytest.fixture
def writer(
    redis_conn: aioredis.Redis, key_prefix: str, books: Books, budgets: BudgetBook
) -> LedgerWriter:
    """The ledger's real path, settling budgets: what the edge and the workers write to."""
    events = RedisKeys(key_prefix).ledger_events
    return LedgerWriter(redis_conn, events, books.ledger, budgets=budgets)


@pytest.fixture
async def edge(
    redis_conn: aioredis.Redis, key_prefix: str, writer: LedgerWriter
) -> AsyncIterator[Edge]:
    """An edge as ``tiergate serve`` wires it: it books what it takes over from a note."""
    edge = booking_edge(redis_conn, RedisKeys(key_prefix), writer)
    yield edge
    await edge.replies.aclose()


def edge_services(dispatcher: Dispatcher, writer: LedgerWriter) -> Any:
    """What the chat handler's disconnect path and ``book_refusal`` use of the services."""
    return SimpleNamespace(
        dispatcher=dispatcher, tracing=Tracing.off(), metrics=Metrics(), ledger_writer=writer
    )


async def client_leaves(services: Any, the_job: Job) -> None:
    """What ``POST /v1/chat/completions`` does when its client goes away before the first
    reply: ``_abandoned``, and the handler books the ``GatewayError`` it raises (a
    ``RelayedError`` is booked elsewhere)."""
    try:
        await _abandoned(services, the_job)
    except RelayedError:
        return
    except GatewayError as error:
        refused = Refusal(
            request_id=the_job.request_id,
            received_at=the_job.received_at,
            error=error,
            plan=the_job.plan,
        )
        await book_refusal(services, PRINCIPAL, refused)


@dataclass
class Rig:
    """Redis, the simulators, the ledger's path and budgets, and the edge."""

    redis: aioredis.Redis
    keys: RedisKeys
    sims: tuple[CountingSim, CountingSim]
    writer: LedgerWriter
    budgets: BudgetBook
    edge: Edge


@pytest.fixture
async def rig(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
    writer: LedgerWriter,
    budgets: BudgetBook,
    edge: Edge,
) -> Rig:
    """A vLLM replica (a 200-token answer streams for about 2 s) and the hosted API."""
    sims = await start_sim(2, itl_s=0.01), await start_sim(2, model=HOSTED)
    return Rig(redis_conn, RedisKeys(key_prefix), sims, writer, budgets, edge)


async def hand_back(
    rig: Rig, make_job: Callable[[], Job], *, replies_before: int = 0, handed_over: bool = False
) -> tuple[Job, AsyncIterator[Reply], list[Reply]]:
    """Submit a job (``make_job``, its worst case reserved on the budget) to a worker that stops
    while its call runs (the hosted API hangs; a stream: once ``replies_before`` replies came),
    noting the call (cancelled, booked as any cancelled call is) and handing the job back. The
    job, the edge's replies, and those that came. ``handed_over``: the job goes to the worker
    waiting idle (its claim taken for it by the enqueue), not through a lane."""
    vllm, hosted = rig.sims
    if not replies_before:
        await set_faults(hosted, hang=True)
    leaving = await start_mixed_node(
        rig.redis, rig.keys, vllm.url, hosted.url, rig.writer, "leaving"
    )
    the_job = make_job()  # its deadline runs from here, once litellm is imported
    if handed_over:
        idle = rig.keys.idle(the_job.plan.tier.value)
        await until(lambda: _registered(rig.redis, idle), 5)
    await rig.budgets.reserve_job(the_job, 50, int(the_job.body["max_tokens"]))
    replies = await rig.edge.dispatcher.submit(the_job)
    came: list[Reply] = []
    try:
        if replies_before:
            async for reply in replies:
                came.append(reply)
                if len(came) == replies_before:
                    break
        else:
            await until(lambda: hosted.now == 1, 10)
    finally:
        await leaving.aclose(drain_s=0.1)
    assert await rig.redis.exists(rig.keys.run_note(the_job.request_id))
    await set_faults(hosted)
    return the_job, replies, came


async def _registered(redis_conn: aioredis.Redis, idle: str) -> bool:
    return int(await redis_conn.zcard(idle)) > 0


async def worker_finds(rig: Rig, the_job: Job) -> None:
    """A worker comes, finds the job handed back (its claim is the edge's) and drops it."""
    vllm, hosted = rig.sims
    stream = rig.keys.jobs(the_job.plan.tier.value, "standard", the_job.tenant)
    taking_over = await start_mixed_node(
        rig.redis, rig.keys, vllm.url, hosted.url, rig.writer, "taking-over", reclaim_idle_s=1.0
    )
    try:
        await until(lambda: _empty(rig.redis, stream), 15)  # acknowledged and deleted
    finally:
        await taking_over.aclose()


async def _empty(redis_conn: aioredis.Redis, stream: str) -> bool:
    return int(await redis_conn.xlen(stream)) == 0


async def settled(budgets: BudgetBook) -> tuple[int, int]:
    (status,) = await budgets.status("acme")
    return status.spent_micro_usd, status.reserved_micro_usd


async def test_a_handed_back_job_whose_client_left_books_its_noted_calls(
    rig: Rig, books: Books
) -> None:
    """The client leaves while its handed-back job waits to be taken over: the edge takes the
    claim (no run can start any more), and the request's one row books the call the provider
    bills; the budget's ``spent`` gets its cost once, nothing stays reserved, and the worker
    that finds the job later runs nothing and books nothing more."""
    _vllm, hosted = rig.sims
    keys = rig.keys
    the_job, replies, _ = await hand_back(rig, lambda: mixed_job("r-gone", (HOSTED,)))
    await client_leaves(edge_services(rig.edge.dispatcher, rig.writer), the_job)
    await replies.aclose()  # type: ignore[attr-defined]
    claim = keys.claim(the_job.plan.tier.value, the_job.request_id)
    assert await rig.redis.get(claim) == EDGE_CLAIM.encode()
    assert await rig.redis.ttl(claim) > CLAIM_TTL_S  # past the deadline: never run now
    assert not await rig.redis.exists(keys.run_note(the_job.request_id))  # booked

    entry = await books.row("r-gone")  # before any worker came
    assert (entry.outcome, entry.status_code) == ("client_disconnected", 499)
    assert calls(entry) == [(HOSTED, "cancelled", True)]
    (back,) = entry.attempts
    assert back.error == "handed back at shutdown during the call"
    assert entry.cost_micro_usd == cost(back) > 0
    assert entry.estimated_micro_usd == cost(back)
    assert (entry.tier, entry.deployment, entry.provisional) == ("external", None, False)
    assert await settled(rig.budgets) == (budget_cost(back), 0)

    await worker_finds(rig, the_job)
    assert await books.row("r-gone") == entry
    assert hosted.now == 0 and len(hosted.served) == 1  # the job was not run again
    assert await books.count() == 1
    assert await settled(rig.budgets) == (budget_cost(back), 0)


@pytest.mark.parametrize("why", ["client left", "deadline", "deadline, handed over"])
async def test_a_stream_handed_back_mid_way_books_its_noted_stream(
    rig: Rig, books: Books, why: str
) -> None:
    """The stream had reached its client when its worker handed it back. Its client leaves
    (the relay's ``abandon_soon``), or its deadline passes before a worker takes it over (the
    edge ends the stream with the error; also for a job the enqueue had handed straight to the
    idle worker, claim taken for it, which the edge waits for as a started job): either way
    the edge holds the claim and the row books the stream as the leaving worker cancelled it
    (vLLM's own usage, not flagged)."""
    # The stream (1,000 tokens: about 10 s) is handed back after 4 chunks, well before its
    # 6 s deadline even on a loaded machine (with 2 s, 3 of 7 runs beside two CPU burners saw
    # the leaving worker's own deadline end the stream first; with 4 s, 1 of 6).
    timeout_s = 60.0 if why == "client left" else 6.0
    the_job, replies, came = await hand_back(
        rig,
        lambda: mixed_job("r-stream", (MODEL,), stream=True, max_tokens=1000, timeout_s=timeout_s),
        replies_before=4,
        handed_over=why.endswith("handed over"),
    )
    if why == "client left":
        rig.edge.dispatcher.abandon_soon(the_job, _never)
        await until(lambda: _note_gone(rig, the_job), 5)
        await replies.aclose()  # type: ignore[attr-defined]
        outcome = ("client_disconnected", 499)
    else:
        async for reply in replies:
            came.append(reply)
        last = came.pop()
        assert last.kind == "error" and last.meta.status == 504, last.data
        assert (last.meta.cost_usd or 0) > 0  # the stream's end carries the cost
        outcome = ("timeout", 504)
    assert {r.kind for r in came} == {"chunk"}

    entry = await books.row("r-stream")  # before any worker came
    assert (entry.outcome, entry.status_code) == outcome
    assert calls(entry) == [(MODEL, "cancelled", False)]
    (back,) = entry.attempts
    assert back.prompt_tokens > 0 and back.completion_tokens >= 3
    assert entry.cost_micro_usd == cost(back) > 0 and entry.estimated_micro_usd is None
    assert not entry.provisional
    assert await settled(rig.budgets) == (budget_cost(back), 0)

    await worker_finds(rig, the_job)
    assert await books.row("r-stream") == entry
    assert await books.count() == 1
    assert await settled(rig.budgets) == (budget_cost(back), 0)


async def _note_gone(rig: Rig, the_job: Job) -> bool:
    return not await rig.redis.exists(rig.keys.run_note(the_job.request_id))


async def _never() -> None:
    raise AssertionError("the request was left to the relay to book")


async def test_a_stream_handed_back_without_its_note_is_booked_when_its_client_leaves(
    rig: Rig, books: Books
) -> None:
    """The leaving worker could not write its note (Redis failed it), so the edge finds no
    note when its client leaves mid-stream and takes the claim: ``abandon`` leaves the request
    to the caller, and the relay's ``book_unrun`` books it, once. No worker runs it again."""
    the_job, replies, _ = await hand_back(
        rig,
        lambda: mixed_job("r-unnoted", (MODEL,), stream=True, max_tokens=200, timeout_s=60.0),
        replies_before=4,
    )
    await rig.redis.delete(rig.keys.run_note(the_job.request_id))  # the write that failed
    booked: list[str] = []

    async def book_unrun() -> None:
        error = ClientDisconnected("the client closed the connection before the answer")
        refused = Refusal(
            request_id=the_job.request_id,
            received_at=the_job.received_at,
            error=error,
            plan=the_job.plan,
            stream=True,
        )
        await book_refusal(edge_services(rig.edge.dispatcher, rig.writer), PRINCIPAL, refused)
        booked.append(the_job.request_id)

    rig.edge.dispatcher.abandon_soon(the_job, book_unrun)
    await until(lambda: booked, 5)
    await replies.aclose()  # type: ignore[attr-defined]
    entry = await books.row("r-unnoted")
    assert (entry.outcome, entry.status_code) == ("client_disconnected", 499)
    claim = rig.keys.claim(the_job.plan.tier.value, the_job.request_id)
    assert await rig.redis.get(claim) == EDGE_CLAIM.encode()

    await worker_finds(rig, the_job)
    assert await books.row("r-unnoted") == entry
    assert await books.count() == 1


async def test_a_handed_back_job_past_its_deadline_is_booked_by_its_edge_at_once(
    rig: Rig, books: Books
) -> None:
    """The deadline passes before any worker takes the job over: the client gets its 504, with
    the cost of the noted call, and the row is booked then, final — no worker need ever come.
    One that comes later books nothing more."""
    _vllm, hosted = rig.sims
    the_job, replies, _ = await hand_back(
        rig, lambda: mixed_job("r-late", (HOSTED,), timeout_s=1.0)
    )
    reply = await anext(replies)  # at the deadline, no worker alive
    assert reply.kind == "error" and reply.meta.status == 504
    assert reply.data["error"]["code"] == "timeout"

    entry = await books.row("r-late")
    assert (entry.outcome, entry.status_code) == ("timeout", 504)
    assert calls(entry) == [(HOSTED, "cancelled", True)]
    (back,) = entry.attempts
    assert entry.cost_micro_usd == cost(back) > 0 and entry.estimated_micro_usd == cost(back)
    assert reply.meta.cost_usd == entry.cost_usd  # the client is told the same
    assert not entry.provisional and entry.superseded_at is None
    assert await settled(rig.budgets) == (budget_cost(back), 0)

    await worker_finds(rig, the_job)
    assert await books.row("r-late") == entry
    assert hosted.now == 0 and len(hosted.served) == 1
    assert await books.count() == 1
    assert await settled(rig.budgets) == (budget_cost(back), 0)


async def test_a_worker_that_reads_the_note_before_the_edge_deleted_it_books_nothing_more(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    edge: Edge,
    books: Books,
    budgets: BudgetBook,
    writer: LedgerWriter,
) -> None:
    """The race the claim leaves open: a worker finds the job (the edge's claim) and reads the
    note between the edge's claim and its deletion, and writes the same calls again. The
    ledger keeps the edge's row, and the budget settles once."""
    keys = RedisKeys(key_prefix)
    the_job = mixed_job("r-race", (HOSTED,))
    await budgets.reserve_job(the_job, 50, 16)
    back = Attempt(HOSTED, "cancelled", 5.0, 40, 0, error="handed back", estimated=True)
    note = RunNote((back,)).encode()
    await redis_conn.set(keys.run_note(the_job.request_id), note, ex=60)
    assert not await edge.dispatcher.abandon(the_job)  # booked by the edge, from the note
    first = await books.row("r-race")
    await redis_conn.set(keys.run_note(the_job.request_id), note, ex=60)  # as read before
    late = await executor(redis_conn, keys, BackendPool({})).noted(the_job)
    assert late is not None and late.attempts == (back,)
    await writer.write(late)
    assert await books.row("r-race") == first
    assert await books.count() == 1
    assert (first.outcome, first.attempts, first.cost_micro_usd) == (
        "client_disconnected",
        (back,),
        cost(back),
    )
    assert await settled(budgets) == (budget_cost(back), 0)


async def test_a_cancel_heard_before_the_take_over_books_the_noted_calls(
    rig: Rig, books: Books
) -> None:
    """The worker taking a handed-back job over wins its claim, so its edge's cancel goes out
    on the channel, and it can be heard before the job runs there (``EarlyCancels``). The run
    ends at once, 499, without a call, and its row still books the noted call the provider
    bills."""
    vllm, hosted = rig.sims
    the_job, replies, _ = await hand_back(rig, lambda: mixed_job("r-early", (HOSTED,)))
    taking_over = await start_mixed_node(
        rig.redis, rig.keys, vllm.url, hosted.url, rig.writer, "taking-over", reclaim_idle_s=1.0
    )
    try:
        assert not taking_over.worker.cancel(the_job.request_id)  # heard; nothing runs yet
        entry = await books.row("r-early")
    finally:
        await taking_over.aclose()
        await replies.aclose()  # type: ignore[attr-defined]
    assert (entry.outcome, entry.status_code) == ("client_disconnected", 499)
    assert calls(entry) == [(HOSTED, "cancelled", True)]
    (back,) = entry.attempts
    assert entry.cost_micro_usd == cost(back) > 0
    assert len(hosted.served) == 1  # only the call before the hand-back
    assert await settled(rig.budgets) == (budget_cost(back), 0)


async def test_a_worker_leaves_the_note_to_the_edge_still_booking_it(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    books: Books,
    budgets: BudgetBook,
    writer: LedgerWriter,
) -> None:
    """The edge took a handed-back job's claim to answer it 503 ``shutting_down`` (its drain
    ended) and is about to book it; a worker finds the job (the edge's claim) and its note in
    between. The worker cannot know that answer (its guess is 499 or 504): it gives the edge
    time to book, and the row says what the client got. Seen in the SIGTERM test: a client
    answered 503 whose row said 499."""
    keys = RedisKeys(key_prefix)
    the_job = mixed_job("r-shutdown", (HOSTED,))
    await budgets.reserve_job(the_job, 50, 16)
    back = Attempt(HOSTED, "cancelled", 5.0, 40, 0, error="handed back", estimated=True)
    await redis_conn.set(keys.run_note(the_job.request_id), RunNote((back,)).encode(), ex=60)
    await redis_conn.set(keys.claim(the_job.plan.tier.value, the_job.request_id), EDGE_CLAIM)
    booking = NotedBooking(redis_conn, keys, Billing(PriceBook(PRICES), CATALOG, {}), writer)
    answer = ServiceUnavailable("the gateway is shutting down", code="shutting_down")

    async def edge_books_soon() -> None:
        await asyncio.sleep(0.3)
        await booking.book(the_job, RunNote((back,)), answer)

    edge_booking = asyncio.create_task(edge_books_soon())
    late = await executor(redis_conn, keys, BackendPool({})).noted(the_job)
    if late is not None:
        await writer.write(late)
    await edge_booking
    row = await books.row("r-shutdown")
    assert (row.status_code, row.outcome) == (503, "shutting_down")
    assert await books.count() == 1
    assert await settled(budgets) == (budget_cost(back), 0)
