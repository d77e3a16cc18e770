"""A worker dies while the hosted API holds its call; the client gets its 504 at the deadline
plus 5 s, before any worker takes the job over. The run that takes it over later books the dead
worker's call (from estimates, flagged: the provider bills it) into the request's one row,
which still says the client got a 504, and the tenant's budget gets its cost once.

Real processes: the simulators, an edge (``serve --no-workers``), two workers (the first
SIGKILLed), Redis, SQLite. Slow: the reclaim waits for the dead worker's entry to go idle (15 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.rollups import rollup_day
from gateway.accounting.verify import verify_ledger
from tests.support import TEST_KEYS, Stack, until
from tests.support.ledger import wait_entry

SMALL, HOSTED = "llama-3.1-8b-instruct", "gpt-4o-mini"


def with_budget(config: dict[str, Any]) -> None:
    config["tenants"]["acme"]["budgets"] = [{"name": "monthly", "limit_usd": "100"}]


@pytest.fixture
def split(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """An edge (``serve --no-workers``) and one worker process."""
    with Stack.run(
        tmp_path, redis_url, (SMALL, HOSTED), edit=with_budget, edge_only=True,
        workers=("worker-a",),
    ) as running:  # fmt: skip
        yield running


def spent_micro_usd(split: Stack) -> int:
    month = datetime.now(UTC).strftime("%Y-%m-01")
    client = redis.Redis.from_url(split.redis_url)
    try:
        raw = client.hget(f"{split.prefix}:{{budget:acme}}:b:monthly:{month}", "spent")
    finally:
        client.close()
    return int(raw or 0)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_a_job_taken_over_after_the_edges_504_books_the_dead_workers_call(
    split: Stack,
) -> None:
    split.faults(HOSTED, hang=True)
    (first,) = split.workers
    client = redis.Redis.from_url(split.redis_url)
    try:
        async with httpx.AsyncClient(base_url=split.base_url, timeout=60) as http:
            sent = http.post(
                "/v1/chat/completions",
                headers={
                    "authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}",
                    "x-tiergate-timeout-ms": "4000",
                },
                json={
                    "model": HOSTED,
                    "messages": [{"role": "user", "content": "What is a ledger, briefly?"}],
                    "max_tokens": 32,
                },
            )
            answer = asyncio.ensure_future(sent)
            notes = f"{split.prefix}:{{req:*}}:run"
            await until(  # the note written before the hosted call was sent
                lambda: next(client.scan_iter(match=notes), None) is not None,
                4.0,
                what="the worker never called the hosted API",
            )
            first.popen.kill()  # the worker dies while the provider holds the call
            first.popen.wait()
            second = split.start_worker("worker-b")
            split.faults(HOSTED)
            response = await answer
    finally:
        client.close()
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "timeout"
    request_id = response.headers["x-request-id"]
    entry = await wait_entry(
        split.database_url,
        request_id,
        timeout_s=60,
        where=lambda e: e.superseded_at is not None,
        what="replaced",
    )
    second.stop()  # the ledger is checked below as the takeover left it
    assert (entry.outcome, entry.status_code) == ("timeout", 504)  # what the client got
    # the deadline, then the edge's 5 s (asyncio may wake a timer a little early: 50 ms slack)
    assert entry.latency_ms >= 9_000 - 50
    ((deployment, outcome, estimated),) = [
        (a.deployment, a.outcome, a.estimated) for a in entry.attempts
    ]
    assert (deployment, outcome, estimated) == (HOSTED, "worker_lost", True)
    assert entry.prompt_tokens > 0 and entry.cost_micro_usd is not None
    assert entry.cost_micro_usd == entry.estimated_micro_usd > 0
    assert not entry.provisional
    # settled once, at the real cost: the budget settles nano-dollars rounded up to the micro
    assert entry.cost_nano_usd is not None
    assert spent_micro_usd(split) == -(-entry.cost_nano_usd // 1000)
    ledger = await SqlLedger.connect(split.database_url)
    try:
        await rollup_day(ledger, entry.created_at.date())
        report = await verify_ledger(ledger)
    finally:
        await ledger.aclose()
    assert report.ok, report.differences
    assert report.rows == 1
