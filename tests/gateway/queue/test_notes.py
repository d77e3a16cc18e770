"""Run notes: what a call in flight when its worker stopped is booked by the next run (pure),
and notes in Redis (real Redis)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis.asyncio as aioredis

from backends.types import Usage
from gateway.accounting.records import Attempt
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.notes import InFlight, RunNote, RunNotes
from gateway.queue.run import Run
from router.features import PromptFeatures
from tests.gateway.queue.conftest import job

HOSTED, LOCAL = "gpt-4o-mini", "llama-3.1-8b-instruct"
BODY = {"messages": [{"role": "user", "content": "What is the capital of France, and why?"}]}
FAILED = Attempt(LOCAL, "unavailable", 12.5, error="503")
PROMPT_ESTIMATE = PromptFeatures.from_messages(BODY["messages"]).estimated_prompt_tokens


def external(deployment: str) -> bool:
    return deployment == HOSTED


@pytest.mark.parametrize(
    ("inflight", "tokens", "estimated"),
    [
        # a hosted call: the provider bills it; prompt estimated, completion what was relayed
        (InFlight(HOSTED, 1.0), (PROMPT_ESTIMATE, 0), True),
        (InFlight(HOSTED, 1.0, pieces=3), (PROMPT_ESTIMATE, 3), True),
        (InFlight(HOSTED, 1.0, Usage(40, 2), pieces=5), (40, 5), True),
        # vLLM: what it reported, else nothing; no invoice to reconcile: not flagged
        (InFlight(LOCAL, 1.0), (0, 0), False),
        (InFlight(LOCAL, 1.0, Usage(37, 1), pieces=1), (37, 1), False),
    ],
)
def test_the_call_in_flight_is_booked_as_lost(
    inflight: InFlight, tokens: tuple[int, int], estimated: bool
) -> None:
    note = RunNote.decode(RunNote((FAILED,), inflight).encode())
    assert note == RunNote((FAILED,), inflight)
    failed, lost = note.booked(BODY, external=external)
    assert failed == FAILED
    assert (lost.deployment, lost.outcome) == (inflight.deployment, "worker_lost")
    assert (lost.prompt_tokens, lost.completion_tokens, lost.estimated) == (*tokens, estimated)


def test_a_note_without_a_call_in_flight_books_its_calls_as_they_were() -> None:
    hosted = Attempt(HOSTED, "timeout", 900.0, prompt_tokens=12, estimated=True)
    note = RunNote.decode(RunNote((FAILED, hosted)).encode())
    assert note.booked(BODY, external=external) == (FAILED, hosted)


async def test_notes_live_in_the_requests_slot_and_expire_with_its_claim(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    notes = RunNotes(redis_conn, keys, keep_s=60)
    the_job = job("r-note", "edge1", timeout_s=30)
    run = Run(the_job, time.time(), carried=(FAILED,))
    run.record(HOSTED, "timeout", time.time(), Usage(9, 0), "slow", estimated=True)
    key = keys.run_note("r-note")
    assert "{req:r-note}" in key
    await notes.save(run, InFlight(HOSTED, 2.0))
    assert 85 <= await redis_conn.ttl(key) <= 90  # the deadline, then the claim's time
    got = await notes.read("r-note")
    assert got is not None
    assert got.inflight == InFlight(HOSTED, 2.0)
    carried, timed_out = got.attempts  # the earlier runs' calls, then this run's
    assert carried == FAILED
    assert timed_out == dataclasses.replace(run.attempts[0], latency_ms=timed_out.latency_ms)
    await redis_conn.set(key, b"not json")
    assert await notes.read("r-note") is None  # logged, not raised: the job still runs
    assert await notes.read("r-none") is None
