"""A worker dies while the hosted API holds its call; the client gets its 504 at the deadline
plus 5 s, before any worker takes the job over. The run that takes it over later books the dead
worker's call (from estimates, flagged: the provider bills it) into the request's one row,
which still says the client got a 504, and the tenant's budget gets its cost once.

Real processes: the simulators, an edge (``serve --no-workers``), two workers (the first
SIGKILLed), Redis, SQLite. Slow: the reclaim waits for the dead worker's entry to go idle (15 s).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import LedgerEntry
from gateway.accounting.rollups import rollup_day
from gateway.accounting.verify import verify_ledger
from tests.support import (
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)

SMALL, HOSTED = "llama-3.1-8b-instruct", "gpt-4o-mini"


def start_worker(config: Path, workdir: Path, name: str) -> Proc:
    """A worker process (and sink) with a config of its own (its own admin port)."""
    own = workdir / name
    own.mkdir()
    data = yaml.safe_load(config.read_text())
    data["server"]["admin_port"] = free_port()
    path = own / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    args = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(path)]
    return Proc(args, workdir / f"{name}.log", TEST_KEYS)


def faults(port: int, **set_: Any) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/faults",
        data=json.dumps(set_).encode(),
        method="POST" if set_ else "DELETE",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


@dataclass
class Split:
    base_url: str
    database_url: str
    config: Path
    workdir: Path
    prefix: str
    hosted_port: int
    first: Proc
    redis: redis.Redis


@pytest.fixture
def split(tmp_path: Path, redis_url: str) -> Iterator[Split]:
    prefix = f"tgtest-{uuid.uuid4().hex[:10]}"
    port, admin = free_port(), free_port()
    ports = {SMALL: free_port(), HOSTED: free_port()}
    sims = [start_sim(profile, p, tmp_path)[0] for profile, p in ports.items()]
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    config = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=prefix,
        database_url=database_url,
        sim_ports=ports,
        port=port,
        admin_port=admin,
    )
    data = yaml.safe_load(config.read_text())
    data["tenants"]["acme"]["budgets"] = [{"name": "monthly", "limit_usd": "100"}]
    config.write_text(yaml.safe_dump(data))
    edge = start_gateway(config, tmp_path, "--no-workers")
    first = start_worker(config, tmp_path, "worker-a")
    client = redis.Redis.from_url(redis_url)
    try:
        wait_ready(edge, f"http://127.0.0.1:{port}/readyz")
        yield Split(
            f"http://127.0.0.1:{port}",
            database_url,
            config,
            tmp_path,
            prefix,
            ports[HOSTED],
            first,
            client,
        )
    finally:
        first.stop()
        edge.stop()
        for sim in sims:
            sim.stop()
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        client.close()


async def replaced_row(database_url: str, request_id: str, timeout_s: float) -> LedgerEntry:
    ledger = await SqlLedger.connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            entry = await ledger.get(request_id)
            if entry is not None and entry.superseded_at is not None:
                return entry
            if time.monotonic() > deadline:
                raise AssertionError(f"{request_id}: booked {entry}, never replaced")
            await asyncio.sleep(0.2)
    finally:
        await ledger.aclose()


def spent_micro_usd(split: Split) -> int:
    month = datetime.now(UTC).strftime("%Y-%m-01")
    raw = split.redis.hget(f"{split.prefix}:{{budget:acme}}:b:monthly:{month}", "spent")
    return int(raw or 0)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_a_job_taken_over_after_the_edges_504_books_the_dead_workers_call(
    split: Split,
) -> None:
    faults(split.hosted_port, hang=True)
    second: Proc | None = None
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
            for _ in range(200):  # the note written before the hosted call was sent
                if next(split.redis.scan_iter(match=notes), None) is not None:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the worker never called the hosted API")
            split.first.popen.kill()  # the worker dies while the provider holds the call
            split.first.popen.wait()
            second = start_worker(split.config, split.workdir, "worker-b")
            faults(split.hosted_port)
            response = await answer
        assert response.status_code == 504, response.text
        assert response.json()["error"]["code"] == "timeout"
        request_id = response.headers["x-request-id"]
        entry = await replaced_row(split.database_url, request_id, timeout_s=60)
    finally:
        if second is not None:
            second.stop()
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
    assert spent_micro_usd(split) == entry.cost_micro_usd  # settled once, at the real cost
    ledger = await SqlLedger.connect(split.database_url)
    try:
        await rollup_day(ledger, entry.created_at.date())
        report = await verify_ledger(ledger)
    finally:
        await ledger.aclose()
    assert report.ok, report.differences
    assert report.rows == 1
