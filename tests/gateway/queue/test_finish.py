"""Book before you answer: a worker killed (SIGKILL, a real process) at each point of a job's
end, between the backend's last byte and the acknowledgement. The client's answer and the
request's ledger row always agree, and an answer that reached its client is never run again.

The dying worker books through the real ledger writer and coalescer (``finish_proc``); the
survivor runs in this process. Rows are read from the ledger stream, folded as the sink folds
them (``supersede.fold``)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import gateway.queue.edge.dispatcher as dispatcher_module
from gateway.accounting.events import decode_entry
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import LedgerEntry
from gateway.accounting.supersede import fold
from gateway.accounting.writer import LedgerWriter
from gateway.coalescer import Coalescer
from gateway.errors import GatewayError, RunTimedOut
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import CountingSim, Edge, Node, job, start_node
from tests.support import until

ROOT = Path(__file__).resolve().parents[3]


async def _doomed(redis_url: str, prefix: str, sim: CountingSim, point: str, db: Path) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.queue.finish_proc", redis_url, prefix, sim.url,
        "doomed", point, str(db),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"ready"
    return proc


async def _rows(redis: aioredis.Redis, keys: RedisKeys, request_id: str) -> list[LedgerEntry]:
    events = [decode_entry(fields[b"e"]) for _id, fields in await redis.xrange(keys.ledger_events)]
    return [e for e in fold(events, datetime.now(UTC)) if e.request_id == request_id]


async def _answer(edge: Edge, j: Job) -> Reply | GatewayError:
    try:
        reply, _wait = await edge.call(j)
    except GatewayError as error:
        return error
    return reply


class Survivor:
    def __init__(self, node: Node, coalescer: Coalescer, ledger: SqlLedger) -> None:
        self.node, self.coalescer, self.ledger = node, coalescer, ledger


@pytest.fixture
async def survivor_of(
    redis_conn: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> AsyncIterator[Any]:
    started: list[Survivor] = []

    async def start(sim: CountingSim) -> Survivor:
        keys = RedisKeys(key_prefix)
        coalescer = Coalescer(redis_conn)
        ledger = await SqlLedger.connect(f"sqlite+aiosqlite:///{tmp_path / 'survivor.db'}")
        writer = LedgerWriter(redis_conn, keys.ledger_events, ledger, coalescer=coalescer)
        node = await start_node(
            redis_conn, keys, [sim], writer, "survivor", reclaim_idle_s=1.5, heartbeat_s=0.3,
            coalescer=coalescer,
        )  # fmt: skip
        started.append(Survivor(node, coalescer, ledger))
        return started[-1]

    yield start
    for s in started:
        await s.node.aclose()
        await s.coalescer.aclose()
        await s.ledger.aclose()


def _status(answer: Reply | GatewayError) -> int:
    if isinstance(answer, GatewayError):
        return answer.status
    return 200 if answer.kind == "result" else answer.meta.status or 0


@pytest.mark.slow
async def test_a_worker_killed_before_booking_had_answered_nothing_and_its_job_runs_once_more(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
    survivor_of: Any,
    tmp_path: Path,
) -> None:
    """Before: the answer went out first, and the job taken over ran a second time for a
    client that already had it."""
    sim = await start_sim(2, itl_s=0.01)
    keys = RedisKeys(key_prefix)
    proc = await _doomed(redis_url, key_prefix, sim, "booking", tmp_path / "doomed.db")
    answer = asyncio.create_task(_answer(edge, job("r1", edge.edge_id, timeout_s=30)))
    await asyncio.wait_for(proc.wait(), 20)  # it died with the backend's answer in hand
    await asyncio.sleep(0.3)
    assert not answer.done()  # nothing reached the client
    assert await _rows(redis_conn, keys, "r1") == []
    await survivor_of(sim)
    got = await asyncio.wait_for(answer, 20)
    assert isinstance(got, Reply) and got.kind == "result"
    rows = await _rows(redis_conn, keys, "r1")
    assert [(r.outcome, r.status_code) for r in rows] == [("ok", 200)]
    assert rows[0].completion_tokens > 0
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:survivor"
    assert await redis_conn.xlen(keys.jobs("small", "standard", "acme")) == 0


@pytest.mark.slow
async def test_a_worker_killed_before_booking_past_the_deadline_leaves_the_504_its_client_got(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
    survivor_of: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: the client had its 200 and the job, taken over past its deadline, was booked
    504 with no call."""
    monkeypatch.setattr(dispatcher_module, "RUNNING_GRACE_S", 0.5)
    sim = await start_sim(2, itl_s=0.01)
    keys = RedisKeys(key_prefix)
    proc = await _doomed(redis_url, key_prefix, sim, "booking", tmp_path / "doomed.db")
    j = job("r1", edge.edge_id, timeout_s=2.0)
    answer = asyncio.create_task(_answer(edge, j))
    await asyncio.wait_for(proc.wait(), 20)
    got = await asyncio.wait_for(answer, 10)  # at the deadline plus the grace
    assert isinstance(got, RunTimedOut)
    await asyncio.sleep(max(j.deadline - time.time(), 0.0))
    await survivor_of(sim)
    await until(lambda: _rows(redis_conn, keys, "r1"), 15)
    rows = await _rows(redis_conn, keys, "r1")
    assert [(r.outcome, r.status_code) for r in rows] == [("timeout", _status(got))]
    assert await redis_conn.xlen(keys.jobs("small", "standard", "acme")) == 0


@pytest.mark.slow
async def test_a_worker_killed_after_booking_answered_and_its_job_never_runs_again(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
    survivor_of: Any,
    tmp_path: Path,
) -> None:
    sim = await start_sim(2, itl_s=0.01)
    keys = RedisKeys(key_prefix)
    proc = await _doomed(redis_url, key_prefix, sim, "booked", tmp_path / "doomed.db")
    got = await asyncio.wait_for(_answer(edge, job("r1", edge.edge_id, timeout_s=30)), 20)
    await asyncio.wait_for(proc.wait(), 10)
    assert isinstance(got, Reply) and got.kind == "result"
    await survivor_of(sim)
    await asyncio.sleep(3.0)  # two reclaim rounds past the entry's idle time
    rows = await _rows(redis_conn, keys, "r1")
    assert [(r.outcome, r.status_code) for r in rows] == [("ok", 200)]
    assert len(sim.served) == 1  # never run again
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:doomed"
    assert await redis_conn.xlen(keys.jobs("small", "standard", "acme")) == 0
