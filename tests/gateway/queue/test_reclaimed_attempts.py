"""A job run twice books both runs in its one ledger row: the calls of the run that stopped (its
worker died, or handed the job back at shutdown) reach the row the next run writes, the call it
had in flight included (a hosted API's from estimates, flagged), costs summed. The common path
(the first call answers, the first run) writes no note and books as before.

Real Redis, simulators as real HTTP servers (the hosted API through litellm), the ledger's real
path (event stream, sink, SQLite), a worker process killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import ROUND_CEILING, Decimal
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from backends.types import Usage
from gateway.accounting.records import NANO, Attempt, LedgerEntry, to_micro, to_nano
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.notes import RunNote
from tests.gateway.queue.conftest import MODEL, CountingSim, Edge
from tests.gateway.queue.mixed import (
    HOSTED,
    PRICES,
    Books,
    edge_estimate,
    executor,
    mixed_job,
    mixed_pool,
    set_faults,
    start_mixed_node,
)
from tests.support import until

pytestmark = pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211"
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def sims(
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> tuple[CountingSim, CountingSim]:
    """A vLLM replica and the hosted API, two slots each."""
    return await start_sim(2), await start_sim(2, model=HOSTED)


@pytest.fixture
async def books(
    redis_conn: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> AsyncIterator[Books]:
    opened = await Books.open(redis_conn, RedisKeys(key_prefix), tmp_path / "ledger.db")
    yield opened
    await opened.aclose()


def cost(*attempts: Attempt) -> int:
    """What ``attempts`` cost at the test's prices, summed exactly, in micro-dollars."""
    total = sum(
        (PRICES[a.deployment].cost(Usage(a.prompt_tokens, a.completion_tokens)) for a in attempts),
        start=Decimal(0),
    )
    return to_micro(total)


def budget_cost(*attempts: Attempt) -> int:
    """What a budget's ``spent`` gets for ``attempts``: their cost rounded up to the micro."""
    total = sum(
        (PRICES[a.deployment].cost(Usage(a.prompt_tokens, a.completion_tokens)) for a in attempts),
        start=Decimal(0),
    )
    return to_micro(to_nano(total) * NANO, rounding=ROUND_CEILING)


def calls(entry: LedgerEntry) -> list[tuple[str, str, bool]]:
    return [(a.deployment, a.outcome, a.estimated) for a in entry.attempts]


def answered(attempt: Attempt, reply: Reply) -> bool:
    """The attempt is booked the usage the backend answered with."""
    usage = reply.data["usage"]
    counts = (usage["prompt_tokens"], usage["completion_tokens"])
    return (attempt.prompt_tokens, attempt.completion_tokens) == counts and not attempt.estimated


@pytest.mark.slow
async def test_a_dead_workers_calls_are_booked_by_the_run_that_finishes_its_job(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    sims: tuple[CountingSim, CountingSim],
    edge: Edge,
    books: Books,
) -> None:
    """The 8B refuses twice (503), the hosted API holds the call; the worker is killed. The
    survivor's row: both refusals, the hosted call booked from estimates (the provider bills
    it), then the 8B's answer."""
    vllm, hosted = sims
    keys = RedisKeys(key_prefix)
    await set_faults(vllm, error_status=503)
    await set_faults(hosted, hang=True)
    the_job = mixed_job("r-dead", (MODEL, HOSTED))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.queue.mixed_worker_proc", redis_url, key_prefix,
        vllm.url, hosted.url, "doomed",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
        answer = asyncio.create_task(edge.call(the_job))
        await until(lambda: hosted.now == 1, 20)  # refused twice, now in the provider's hands
        raw = await redis_conn.get(keys.run_note("r-dead"))
        note = RunNote.decode(raw)
        assert [a.outcome for a in note.attempts] == ["unavailable", "unavailable"]
        assert note.inflight is not None and note.inflight.deployment == HOSTED
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    await set_faults(vllm)
    await set_faults(hosted)
    survivor = await start_mixed_node(
        redis_conn, keys, vllm.url, hosted.url, books.writer, "survivor"
    )
    try:
        reply, _wait = await asyncio.wait_for(answer, 30)
    finally:
        await survivor.aclose()
    assert reply.kind == "result"
    entry = await books.row("r-dead")
    assert entry.outcome == "ok" and entry.deployment == MODEL
    assert calls(entry) == [
        (MODEL, "unavailable", False),
        (MODEL, "unavailable", False),
        (HOSTED, "worker_lost", True),
        (MODEL, "ok", False),
    ]
    lost, ok = entry.attempts[2], entry.attempts[3]
    assert (lost.prompt_tokens, lost.completion_tokens) == (edge_estimate(the_job), 0)
    assert answered(ok, reply)
    assert entry.prompt_tokens == lost.prompt_tokens + ok.prompt_tokens
    assert entry.completion_tokens == ok.completion_tokens
    assert entry.cost_micro_usd == cost(lost, ok) > cost(ok) > 0
    assert entry.estimated_micro_usd == cost(lost) > 0
    assert reply.meta.cost_usd == entry.cost_usd  # the client is told the same
    assert await books.count() == 1


async def test_a_job_handed_back_at_shutdown_books_its_interrupted_hosted_call(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    sims: tuple[CountingSim, CountingSim],
    edge: Edge,
    books: Books,
) -> None:
    """The hosted call outlives the grace period: the worker books it as cancelled (estimated,
    the provider bills it) in the note, hands the job back, and the next worker's row has it."""
    vllm, hosted = sims
    keys = RedisKeys(key_prefix)
    await set_faults(hosted, hang=True)
    the_job = mixed_job("r-back", (HOSTED,))
    leaving = await start_mixed_node(
        redis_conn, keys, vllm.url, hosted.url, books.writer, "leaving"
    )
    answer = asyncio.create_task(edge.call(the_job))
    try:
        await until(lambda: hosted.now == 1, 20)
    finally:
        await leaving.aclose(drain_s=0.2)
    note = RunNote.decode(await redis_conn.get(keys.run_note("r-back")))
    assert note.inflight is None
    assert [(a.outcome, a.estimated) for a in note.attempts] == [("cancelled", True)]
    await set_faults(hosted)
    taking_over = await start_mixed_node(
        redis_conn, keys, vllm.url, hosted.url, books.writer, "taking-over", reclaim_idle_s=1.0
    )
    try:
        reply, _wait = await asyncio.wait_for(answer, 20)
    finally:
        await taking_over.aclose()
    assert reply.kind == "result"
    entry = await books.row("r-back")
    assert calls(entry) == [(HOSTED, "cancelled", True), (HOSTED, "ok", False)]
    back, ok = entry.attempts
    assert back.error == "handed back at shutdown during the call"
    assert (back.prompt_tokens, back.completion_tokens) == (edge_estimate(the_job), 0)
    assert answered(ok, reply)
    assert entry.cost_micro_usd == cost(back, ok) > cost(ok) > 0
    assert entry.estimated_micro_usd == cost(back)
    assert await books.count() == 1


async def test_a_vllm_stream_handed_back_at_shutdown_books_its_last_usage(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
    edge: Edge,
    books: Books,
) -> None:
    """The stream had reached its client when the worker stopped: the next worker ends it with
    the error (never the answer again) and its row books the stream as the leaving worker
    cancelled it, with the usage of the last chunk vLLM sent (its own count, not flagged)."""
    vllm, hosted = await start_sim(2, itl_s=0.05), await start_sim(2, model=HOSTED)
    keys = RedisKeys(key_prefix)
    the_job = mixed_job("r-stream", (MODEL,), stream=True, max_tokens=200)
    leaving = await start_mixed_node(
        redis_conn, keys, vllm.url, hosted.url, books.writer, "leaving"
    )
    replies = await edge.dispatcher.submit(the_job)
    kinds: list[str] = []
    try:
        async for reply in replies:
            kinds.append(reply.kind)
            if len(kinds) == 6:
                break
    finally:
        await leaving.aclose(drain_s=0.1)
    taking_over = await start_mixed_node(
        redis_conn, keys, vllm.url, hosted.url, books.writer, "taking-over", reclaim_idle_s=1.0
    )
    try:
        async for reply in replies:
            kinds.append(reply.kind)
    finally:
        await taking_over.aclose()
    # the chunks relayed before the worker stopped (some during its grace), then the error
    assert kinds[-1] == "error" and set(kinds[:-1]) == {"chunk"} and len(kinds) > 6
    entry = await books.row("r-stream")
    assert entry.outcome == "stream_error"
    assert calls(entry) == [(MODEL, "cancelled", False)]
    (back,) = entry.attempts
    assert back.error == "handed back at shutdown during the stream"
    assert back.prompt_tokens > 0 and back.completion_tokens >= len(kinds) - 3
    assert entry.cost_micro_usd == cost(back) and entry.estimated_micro_usd is None


async def test_a_first_call_that_answers_writes_no_note_and_books_as_before(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    sims: tuple[CountingSim, CountingSim],
    edge: Edge,
    books: Books,
) -> None:
    vllm, hosted = sims
    keys = RedisKeys(key_prefix)
    node = await start_mixed_node(redis_conn, keys, vllm.url, hosted.url, books.writer, "w1")
    try:
        reply, _wait = await edge.call(mixed_job("r-plain", (MODEL, HOSTED)))
    finally:
        await node.aclose()
    assert reply.kind == "result"
    entry = await books.row("r-plain")
    assert calls(entry) == [(MODEL, "ok", False)]
    assert answered(entry.attempts[0], reply)
    assert entry.cost_micro_usd == cost(entry.attempts[0]) > 0
    assert entry.estimated_micro_usd is None
    assert not await redis_conn.exists(keys.run_note("r-plain"))  # nothing sent for it


# -- the executor alone: one run, then a run that takes the job over ------------------------


def same_prompt(the_job: Job) -> Job:
    """``the_job`` under a fresh request id, its messages unchanged (the simulators answer the
    same messages with the same text)."""
    return dataclasses.replace(the_job, request_id=f"req_{uuid.uuid4().hex}")


def as_booked(entry: LedgerEntry) -> tuple[object, ...]:
    """What a row books, without its id and timings."""
    return (
        entry.outcome,
        entry.deployment,
        tuple(dataclasses.replace(a, latency_ms=0.0) for a in entry.attempts),
        entry.prompt_tokens,
        entry.completion_tokens,
        entry.cost_micro_usd,
        entry.estimated_micro_usd,
    )


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def ignore(_reply: Reply) -> None:
    return None


@pytest.mark.parametrize("deployment", [MODEL, HOSTED])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_notes_change_nothing_in_the_row_of_a_job_run_once(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    sims: tuple[CountingSim, CountingSim],
    deployment: str,
    stream: bool,
) -> None:
    """Run once, with notes and without: the same row. A stream's note went with its mark."""
    vllm, hosted = sims
    keys = RedisKeys(key_prefix)
    async with aiohttp.ClientSession() as session:
        pool = mixed_pool(redis_conn, keys, vllm.url, hosted.url, session, "w1")
        try:
            first = mixed_job(f"req_{uuid.uuid4().hex}", (deployment,), stream=stream)
            again = same_prompt(first)
            without = await executor(redis_conn, keys, pool, notes=False).run(first, ignore)
            noted = await executor(redis_conn, keys, pool).run(again, ignore)
        finally:
            await pool.aclose()
    assert without.outcome == "ok"
    assert as_booked(noted) == as_booked(without)
    written = await redis_conn.exists(keys.run_note(again.request_id))
    assert written == (stream or deployment == HOSTED)  # with the mark / before the hosted call


async def test_a_stream_taken_over_after_its_first_chunk_books_what_vllm_reported(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    sims: tuple[CountingSim, CountingSim],
) -> None:
    """The stream's first chunk went out with its mark and its note (the stream in flight, with
    the usage vLLM reported in that chunk). A run that takes the job over then (the first
    worker died mid-stream) ends the stream with the error and books that call: vLLM's own
    count of the prompt, not flagged (no provider invoices our GPUs)."""
    vllm, hosted = sims
    keys = RedisKeys(key_prefix)
    the_job = mixed_job(f"req_{uuid.uuid4().hex}", (MODEL,), stream=True)
    long = " ".join(["Tell me about the history of the city and its rivers."] * 200)
    the_job = dataclasses.replace(the_job, body={**the_job.body, "messages": [user(long)]})
    async with aiohttp.ClientSession() as session:
        pool = mixed_pool(redis_conn, keys, vllm.url, hosted.url, session, "w1")
        try:
            first = await executor(redis_conn, keys, pool).run(the_job, ignore)
            replies: list[Reply] = []

            async def keep(reply: Reply) -> None:
                replies.append(reply)

            second = await executor(redis_conn, keys, pool).run(the_job, keep, reclaimed=True)
        finally:
            await pool.aclose()
    assert [r.kind for r in replies] == ["error"]  # never the answer started over
    assert second.outcome == "stream_error"
    (lost,) = second.attempts
    assert (lost.deployment, lost.outcome, lost.estimated) == (MODEL, "worker_lost", False)
    assert lost.prompt_tokens == first.prompt_tokens > 2000  # vLLM's count, from its first chunk
    assert lost.completion_tokens <= 1
    assert second.cost_micro_usd == cost(lost) > 0
    assert second.estimated_micro_usd is None


async def test_a_job_taken_over_after_its_hosted_call_was_sent_books_that_call(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    sims: tuple[CountingSim, CountingSim],
) -> None:
    """The note written before the hosted call was sent names it in flight; a worker that died
    after it (here: the run ended without booking, as a killed one would) leaves that note. The
    run that takes the job over books the call from estimates, flagged, then its own answer."""
    vllm, hosted = sims
    keys = RedisKeys(key_prefix)
    the_job = mixed_job(f"req_{uuid.uuid4().hex}", (HOSTED,))
    async with aiohttp.ClientSession() as session:
        pool = mixed_pool(redis_conn, keys, vllm.url, hosted.url, session, "w1")
        try:
            await executor(redis_conn, keys, pool).run(the_job, ignore)  # never booked
            second = await executor(redis_conn, keys, pool).run(the_job, ignore, reclaimed=True)
        finally:
            await pool.aclose()
    assert second.outcome == "ok"
    assert calls(second) == [(HOSTED, "worker_lost", True), (HOSTED, "ok", False)]
    lost, ok = second.attempts
    assert (lost.prompt_tokens, lost.completion_tokens) == (edge_estimate(the_job), 0)
    assert second.prompt_tokens == lost.prompt_tokens + ok.prompt_tokens
    assert second.cost_micro_usd == cost(lost, ok) > cost(ok)
    assert second.estimated_micro_usd == cost(lost) > 0
