"""The edge's 504 for a job that had started is provisional, and the run that books the job
later replaces its bookkeeping; a job that never started gets a plain, final 504. (A job handed
back with its calls noted is booked by an edge that books notes, as ``tiergate serve`` wires
it, at once: ``test_handed_back_claims``; an edge that books none leaves it to the worker that
finds the job, as here.)

Real Redis; the handed-back job runs against simulators over HTTP (the hosted API through
litellm), and its row goes the ledger's real path (writer, event stream, sink, SQLite), with a
budget reserved and settled on the real Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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
from gateway.auth.principals import Principal
from gateway.errors import DeadlineExceeded, GatewayError, RunTimedOut
from gateway.metrics import Metrics
from gateway.observability.tracing import Tracing
from gateway.queue.edge import dispatcher as dispatcher_module
from gateway.queue.edge.dispatcher import EDGE_CLAIM
from gateway.queue.jobs import Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.notes import RunNote
from gateway.queue.replicas.pool import BackendPool
from gateway.settings import BudgetSettings
from tests.gateway.queue.conftest import CountingSim, Edge, job
from tests.gateway.queue.mixed import (
    HOSTED,
    PRICES,
    Books,
    booking_edge,
    executor,
    mixed_job,
    set_faults,
    start_mixed_node,
)
from tests.gateway.queue.test_reclaimed_attempts import calls, cost
from tests.support import until, value_when

pytestmark = pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211"
)


async def first_error(edge: Edge, the_job: Any) -> GatewayError:
    replies = await edge.dispatcher.submit(the_job)
    with pytest.raises(DeadlineExceeded) as raised:
        await anext(replies)
    return raised.value


async def test_a_job_that_never_started_gets_a_final_504(
    edge: Edge, redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    error = await first_error(edge, job("never", "edge1", timeout_s=0.3))
    assert not isinstance(error, RunTimedOut)
    claim = await redis_conn.get(RedisKeys(key_prefix).claim("small", "never"))
    assert claim == EDGE_CLAIM.encode()


async def test_a_started_job_without_an_answer_gets_a_provisional_504(
    edge: Edge, redis_conn: aioredis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker holds the claim (it died with the job): the edge waits its grace, then 504."""
    monkeypatch.setattr(dispatcher_module, "RUNNING_GRACE_S", 0.3)
    keys = RedisKeys(key_prefix)
    await redis_conn.set(keys.claim("small", "started"), "a-worker-that-died", ex=60)
    started = time.monotonic()
    error = await first_error(edge, job("started", "edge1", timeout_s=0.3))
    assert isinstance(error, RunTimedOut) and error.status == 504 and error.code == "timeout"
    assert time.monotonic() - started >= 0.55  # the deadline, then the grace
    assert await redis_conn.get(keys.claim("small", "started")) == b"a-worker-that-died"


async def test_a_job_handed_back_with_its_calls_noted_gets_a_provisional_504(
    edge: Edge, redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """Its claim was released at the hand-back, so the edge takes it at the deadline, but the
    note says a run made calls: an edge that books no notes leaves them to a worker that finds
    the job."""
    keys = RedisKeys(key_prefix)
    await redis_conn.set(keys.run_note("back"), RunNote(()).encode(), ex=60)
    error = await first_error(edge, job("back", "edge1", timeout_s=0.3))
    assert isinstance(error, RunTimedOut)
    assert await redis_conn.get(keys.claim("small", "back")) == EDGE_CLAIM.encode()


def edge_services(writer: LedgerWriter) -> Any:
    """What ``book_refusal`` uses of the services: tracing, metrics, the ledger writer."""
    return SimpleNamespace(tracing=Tracing.off(), metrics=Metrics(), ledger_writer=writer)


@pytest.fixture
async def books(
    redis_conn: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> AsyncIterator[Books]:
    opened = await Books.open(redis_conn, RedisKeys(key_prefix), tmp_path / "ledger.db")
    yield opened
    await opened.aclose()


async def test_a_handed_back_job_the_edge_answered_is_booked_by_the_worker_that_finds_it(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
    edge: Edge,
    books: Books,
) -> None:
    """The hosted call outlives the grace period: the leaving worker notes it (cancelled,
    estimated: the provider bills it) and hands the job back; its deadline passes before any
    worker takes it over, so the edge (one that books no notes) answers 504 and books it
    provisional. The worker that then finds the job books the noted call: one row, the client's
    504 and the provider's call; the budget's ``spent`` gets its cost once."""
    vllm, hosted = await start_sim(2), await start_sim(2, model=HOSTED)
    keys = RedisKeys(key_prefix)
    budgets = BudgetBook(
        redis_conn,
        key_prefix,
        {"acme": (BudgetSettings(name="m", limit_usd="10"),)},
        prices=PriceBook(PRICES),
    )
    writer = LedgerWriter(redis_conn, keys.ledger_events, books.ledger, budgets=budgets)
    await set_faults(hosted, hang=True)
    leaving = await start_mixed_node(redis_conn, keys, vllm.url, hosted.url, writer, "leaving")
    the_job = mixed_job("r-late", (HOSTED,), timeout_s=1.0)
    await budgets.reserve_job(the_job, 50, 16)
    answer = asyncio.create_task(first_error(edge, the_job))
    try:
        await until(lambda: hosted.now == 1, 10)
    finally:
        await leaving.aclose(drain_s=0.1)
    error = await asyncio.wait_for(answer, 10)  # at the deadline, no worker alive
    assert isinstance(error, RunTimedOut)
    principal = Principal(name="acme", roles=frozenset({"tenant:acme"}))
    refused = Refusal(
        request_id=the_job.request_id,
        received_at=the_job.received_at,
        error=error,
        plan=the_job.plan,
    )
    await book_refusal(edge_services(writer), principal, refused)
    provisional = await books.row("r-late")
    assert provisional.provisional and provisional.attempts == ()
    (status,) = await budgets.status("acme")
    assert status.spent_micro_usd == 0 and status.reserved_micro_usd > 0  # not settled at $0

    await set_faults(hosted)
    taking_over = await start_mixed_node(
        redis_conn, keys, vllm.url, hosted.url, writer, "taking-over", reclaim_idle_s=1.0
    )
    try:
        entry = await _until_replaced(books, "r-late", 15)
    finally:
        await taking_over.aclose()
    assert (entry.outcome, entry.status_code) == ("timeout", 504)  # what the client got
    assert entry.latency_ms == provisional.latency_ms
    assert calls(entry) == [(HOSTED, "cancelled", True)]
    (back,) = entry.attempts
    assert entry.cost_micro_usd == cost(back) > 0
    assert entry.estimated_micro_usd == cost(back)
    assert entry.deployment is None and not entry.provisional
    assert hosted.now == 0 and len(hosted.served) == 1  # the job was not run again
    assert await books.count() == 1
    (status,) = await budgets.status("acme")
    assert (status.spent_micro_usd, status.reserved_micro_usd) == (cost(back), 0)


async def _until_replaced(books: Books, request_id: str, timeout_s: float) -> Any:
    return await value_when(
        lambda: books.row(request_id),
        lambda entry: entry.superseded_at is not None,
        timeout_s,
        what=f"{request_id}: its provisional row was never replaced",
        every_s=0.1,
    )


async def test_noted_books_the_notes_calls_under_the_answer_the_edge_gave(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """Nothing is run: only the note is read. Past the deadline the edge answered 504; before
    it, the edge could only have taken the claim because the client left."""
    keys = RedisKeys(key_prefix)
    pool = BackendPool({})
    run = executor(redis_conn, keys, pool)
    late, early = mixed_job("n-late", (HOSTED,), timeout_s=0.0), mixed_job("n-early", (HOSTED,))
    assert await run.noted(late) is None  # no note: nothing to book
    back = Attempt(HOSTED, "cancelled", 5.0, 40, 0, error="handed back", estimated=True)
    for the_job in (late, early):
        await redis_conn.set(keys.run_note(the_job.request_id), RunNote((back,)).encode(), ex=60)
    answered_late, gone = await run.noted(late), await run.noted(early)
    assert answered_late is not None and gone is not None
    assert (answered_late.outcome, answered_late.status_code) == ("timeout", 504)
    assert (gone.outcome, gone.status_code) == ("client_disconnected", 499)
    assert answered_late.attempts == (back,) and answered_late.cost_micro_usd == cost(back) > 0


async def test_a_stream_under_way_at_its_deadline_books_the_error_event_its_client_got(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    books: Books,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker holds the claim of a stream whose first chunk reached its client, and nothing
    more reaches the edge by the deadline plus the grace (a killed cluster master held the
    edge's reply stream). The client gets an error event after its chunks; the edge books that
    (200, ``stream_error``), provisional, and the run's entry that comes later joins the row
    keeping the client's part. Before, the edge booked nothing mid-stream and the row was the
    run's 200/ok."""
    monkeypatch.setattr(dispatcher_module, "RUNNING_GRACE_S", 0.3)
    keys = RedisKeys(key_prefix)
    edge = booking_edge(redis_conn, keys, books.writer)
    dispatcher, replies = edge.dispatcher, edge.replies
    the_job = dataclasses.replace(job("cut", "edge1", timeout_s=0.5), stream=True)
    await redis_conn.set(keys.claim("small", "cut"), "a-live-worker", ex=60)
    chunk = {"id": "cut", "object": "chat.completion.chunk", "choices": []}
    try:
        stream = await dispatcher.submit(the_job)
        await redis_conn.xadd(keys.replies("edge1"), Reply("cut", "chunk", chunk).fields())
        assert (await anext(stream)).kind == "chunk"
        last = await anext(stream)  # at the deadline plus the grace
        assert (last.kind, last.meta.status) == ("error", 200)
        assert last.data["error"]["code"] == "stream_error"
    finally:
        await replies.aclose()
    row = await books.row("cut")
    assert (row.outcome, row.status_code, row.provisional) == ("stream_error", 200, True)

    run = dataclasses.replace(row, outcome="ok", completion_tokens=20, provisional=False)
    await books.writer.write(run)  # the run's entry, booked after its answer was lost
    row = await _until_replaced(books, "cut", 10)
    assert (row.outcome, row.status_code, row.completion_tokens) == ("stream_error", 200, 20)
    assert await books.count() == 1
