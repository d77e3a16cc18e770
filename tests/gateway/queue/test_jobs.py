"""The job's wire format: the optional ``traceparent`` (tracing) next to older jobs."""

from __future__ import annotations

import dataclasses

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.queue.jobs import Job
from tests.gateway.queue.conftest import job

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_traceparent_round_trips() -> None:
    traced = dataclasses.replace(job("r1", "edge"), traceparent=TRACEPARENT)
    assert Job.decode(traced.encode()) == traced
    assert orjson.loads(traced.encode())["traceparent"] == TRACEPARENT


def test_without_tracing_the_encoding_is_unchanged_and_old_jobs_decode() -> None:
    plain = job("r2", "edge")
    data = orjson.loads(plain.encode())
    assert "traceparent" not in data  # tracing off: not a byte more per job
    decoded = Job.decode(orjson.dumps(data))  # as a worker gets a job queued before the field
    assert decoded == plain and decoded.traceparent is None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
jobs = st.builds(
    Job,
    request_id=st.text(max_size=12),
    tenant=st.text(max_size=12),
    principal=st.text(max_size=12),
    reply_to=st.text(max_size=12),
    plan=st.sampled_from([job("r", "e").plan, job("r", "e", max_tokens=1).plan]),
    body=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    stream=st.booleans(),
    enqueued_at=st.floats(0, 4e9),
    deadline=st.floats(0, 4e9),
    received_at=st.floats(0, 4e9),
    app=st.none() | st.text(max_size=8),
    tags=st.lists(st.text(max_size=8), max_size=3).map(tuple),
    priority=st.sampled_from(["interactive", "standard", "batch"]),
    idempotency_key=st.none() | st.text(max_size=8),
    conversation=st.none() | st.text(max_size=8),
    traceparent=st.none() | st.just(TRACEPARENT),
    endpoint=st.sampled_from(["chat", "completions", "responses", "embeddings"]),
)


def test_the_strategy_sets_every_field() -> None:
    """A field added to ``Job`` must be added here too, or it is not round-tripped."""
    assert set(jobs.wrapped_strategy.kwargs) == {f.name for f in dataclasses.fields(Job)}


@settings(max_examples=100, deadline=None)
@given(jobs)
def test_any_job_round_trips(queued: Job) -> None:
    assert Job.decode(queued.encode()) == queued


def test_the_endpoint_round_trips_and_chat_adds_nothing() -> None:
    embed = dataclasses.replace(job("r3", "edge"), endpoint="embeddings")
    assert Job.decode(embed.encode()) == embed
    chat = job("r4", "edge")
    assert "endpoint" not in orjson.loads(chat.encode())  # a job queued before the field too
    assert Job.decode(chat.encode()).endpoint == "chat"
