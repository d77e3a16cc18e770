"""The job's wire format: the optional ``traceparent`` (tracing) next to older jobs."""

from __future__ import annotations

import dataclasses

import orjson

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
