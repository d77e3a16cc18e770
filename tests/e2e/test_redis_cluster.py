"""tiergate on a Redis Cluster of the test's own (three masters, three replicas): requests
streamed and not, idempotency keys, budgets, breakers, the ledger stream all work, and a master
fails over (``CLUSTER FAILOVER`` on its replica) under load with nothing lost: every request
gets one answer and one ledger row that says what its client got.

Real processes: the cluster's six ``redis-server``, a simulator, an edge (``serve
--no-workers``) and a worker (with the ledger sink), SQLite. Slow (a cluster to build, a
failover to wait for); the cluster's processes are stopped at the end whatever happens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from backends.sim.answers import answer_pieces
from backends.sim.request import Message
from gateway.queue.keys import RedisKeys
from tests.redis_cluster import LocalRedisCluster
from tests.support import TEST_KEYS, Proc, free_port, gateway_config, start_sim, wait_ready
from tests.support.ledger import wait_entry

SMALL = "llama-3.1-8b-instruct"
PREFIX = "tgc"


@dataclass
class Stack:
    cluster: LocalRedisCluster
    base_url: str
    database_url: str
    procs: list[Proc]
    usage: Path
    """The simulator's usage log: one line per call, with its finish reason."""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    cluster = LocalRedisCluster(tmp_path)
    procs: list[Proc] = []
    try:
        cluster.start()
        sim_port = free_port()
        sim, usage = start_sim(SMALL, sim_port, tmp_path, extra_args=("--itl-ms", "10"))
        procs.append(sim)
        port = free_port()
        database_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
        config = gateway_config(
            workdir=tmp_path,
            redis_url=cluster.url,
            prefix=PREFIX,
            database_url=database_url,
            sim_ports={SMALL: sim_port},
            port=port,
            admin_port=free_port(),
        )
        data = yaml.safe_load(config.read_text())
        data["redis"]["mode"] = "cluster"
        config.write_text(yaml.safe_dump(data))
        worker_dir = tmp_path / "worker"
        worker_dir.mkdir()
        data["server"]["admin_port"] = free_port()
        (worker_dir / "config.yaml").write_text(yaml.safe_dump(data))
        run = [sys.executable, "-m", "gateway.cli"]
        procs.append(
            Proc(
                [*run, "serve", "--no-workers", "--config", str(config)],
                tmp_path / "edge.log",
                TEST_KEYS,
            )
        )
        procs.append(
            Proc(
                [*run, "worker", "--config", str(worker_dir / "config.yaml")],
                tmp_path / "worker.log",
                TEST_KEYS,
            )
        )
        wait_ready(procs[1], f"http://127.0.0.1:{port}/readyz")
        yield Stack(cluster, f"http://127.0.0.1:{port}", database_url, procs, usage)
    finally:
        for proc in reversed(procs):
            proc.stop(timeout_s=20)
        cluster.stop()


@dataclass
class Outcome:
    request_id: str
    status: int
    stream_error: bool = False
    sent_at: float = 0.0
    """When it was sent (the event loop's clock)."""


_numbers = itertools.count()


async def _call(
    client: openai.AsyncOpenAI, *, stream: bool, idempotent: bool, timeout_ms: int | None = None
) -> Outcome:
    n = next(_numbers)
    sent_at = asyncio.get_running_loop().time()
    headers = {"idempotency-key": f"k-{uuid.uuid4().hex}"} if idempotent else {}
    if timeout_ms is not None:
        headers["x-tiergate-timeout-ms"] = str(timeout_ms)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=SMALL if n % 3 else "auto",
            messages=[{"role": "user", "content": f"Question {n}: how do queues work?"}],
            max_tokens=300,
            stream=stream,
            extra_headers=headers,
        )
    except openai.APIStatusError as exc:
        return Outcome(
            exc.response.headers.get("x-request-id", ""), exc.status_code, sent_at=sent_at
        )
    outcome = Outcome(raw.headers["x-request-id"], raw.status_code, sent_at=sent_at)
    if stream:
        try:
            async for _chunk in raw.parse():
                pass
        except openai.APIError:
            outcome.stream_error = True
    else:
        raw.parse()
    return outcome


async def _load(
    base_url: str, n: int, spread_s: float, *, timeout_ms: int | None = None
) -> list[Outcome]:
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key=TEST_KEYS["TIERGATE_KEY_ACME"],
        max_retries=0,
        timeout=60.0,
    ) as client:

        async def one(i: int) -> Outcome:
            await asyncio.sleep(spread_s * i / n)
            return await _call(
                client, stream=i % 2 == 1, idempotent=i % 4 == 0, timeout_ms=timeout_ms
            )

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _reconcile(stack: Stack, outcomes: list[Outcome]) -> None:
    """Every request has a row, and the row says what its client got."""
    assert len({o.request_id for o in outcomes}) == len(outcomes)
    wrong = []
    for o in outcomes:
        assert o.request_id, o
        entry = await wait_entry(stack.database_url, o.request_id, timeout_s=30)
        if o.stream_error:
            right = (entry.status_code, entry.outcome) == (200, "stream_error")
        else:
            right = entry.status_code == o.status and (entry.outcome == "ok") == (o.status == 200)
        if not right:
            wrong.append((o, entry.status_code, entry.outcome, entry.provisional))
    assert not wrong, f"{len(wrong)} rows contradict their answers: {wrong}"


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_requests_on_a_cluster_survive_a_master_failover(stack: Stack) -> None:
    keys = RedisKeys(PREFIX)
    calm = await _load(stack.base_url, 24, 1.0)
    assert [(o.status, o.stream_error) for o in calm] == [(200, False)] * len(calm)
    await _reconcile(stack, calm)

    # The master holding the tier's queue fails over to its replica while 60 requests run.
    queue_master = stack.cluster.master_of(keys.bell("small"))
    loaded = asyncio.create_task(_load(stack.base_url, 60, 6.0))
    await asyncio.sleep(2.0)
    new_master = await asyncio.to_thread(stack.cluster.fail_over, queue_master)
    assert stack.cluster.master_of(keys.bell("small")) == new_master != queue_master
    stormy = await loaded
    await _reconcile(stack, stormy)
    served = sum(o.status == 200 and not o.stream_error for o in stormy)
    assert served >= len(stormy) * 0.9, [(o.status, o.stream_error) for o in stormy]

    # After the switch everything is served again, through the new master.
    after = await _load(stack.base_url, 12, 0.5)
    assert [(o.status, o.stream_error) for o in after] == [(200, False)] * len(after)
    await _reconcile(stack, after)
    for proc in stack.procs[1:]:
        assert proc.popen.poll() is None, proc.output()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_requests_on_a_cluster_survive_a_master_killed(stack: Stack) -> None:
    """The master holding the small tier's queue is killed (SIGKILL) 2 s into 60 requests
    spread over 6 s; its replica is promoted after ``cluster-node-timeout`` (2 s) and the
    election. Every request gets one answer and a row that says what its client got: during
    the outage a 503 (its commands went to the dead node), a stream ending with an error event
    or, when none of its chunks could reach the edge, a 502 is honest; a 504 only for a job
    queued in the moment before the kill and lost with the master (asynchronous replication:
    it never ran); any other 504 means the worker or the edge's reply reader did not come back
    before a 15 s deadline. Every request after the switch is served."""
    keys = RedisKeys(PREFIX)
    timeout_ms = 15_000
    calm = await _load(stack.base_url, 12, 1.0, timeout_ms=timeout_ms)
    assert [(o.status, o.stream_error) for o in calm] == [(200, False)] * len(calm)
    await _reconcile(stack, calm)

    loop = asyncio.get_running_loop()
    queue_master = stack.cluster.master_of(keys.bell("small"))
    loaded = asyncio.create_task(_load(stack.base_url, 60, 6.0, timeout_ms=timeout_ms))
    await asyncio.sleep(2.0)
    killed_at = loop.time()
    await asyncio.to_thread(stack.cluster.kill, queue_master)
    new_master = await asyncio.to_thread(
        stack.cluster.wait_replaced, queue_master, keys.bell("small")
    )
    switch_s = loop.time() - killed_at
    stormy = await loaded
    figures = {
        "switch_s": round(switch_s, 2),
        "200": sum(o.status == 200 and not o.stream_error for o in stormy),
        "503": sum(o.status == 503 for o in stormy),
        "502": sum(o.status == 502 for o in stormy),
        "stream_error": sum(o.stream_error for o in stormy),
        "504": sum(o.status == 504 for o in stormy),
        "other": sorted(o.status for o in stormy if o.status not in (200, 502, 503, 504)),
    }
    print(f"killed {queue_master}, {new_master} took over: {figures}")
    await _reconcile(stack, stormy)
    assert figures["other"] == [], figures
    # A 504 only for a job lost with the master: queued (acknowledged) in the moment before
    # the kill and not yet on its replica (asynchronous replication), so it never ran.
    for o in stormy:
        if o.status == 504:
            entry = await wait_entry(stack.database_url, o.request_id)
            lost = o.sent_at < killed_at and entry.attempts == () and not entry.provisional
            assert lost, (figures, o, entry)

    # After the switch everything is served again, through the new master.
    after = await _load(stack.base_url, 12, 0.5, timeout_ms=timeout_ms)
    assert [(o.status, o.stream_error) for o in after] == [(200, False)] * len(after), figures
    await _reconcile(stack, after)
    for proc in stack.procs[1:]:
        assert proc.popen.poll() is None, proc.output()


def _sim_call(usage: Path, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The simulator's record of ``request_id``'s call, once it has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in usage.read_text().splitlines():
            record = json.loads(line)
            if record["request_id"] == request_id:
                return dict(record)
        time.sleep(0.1)
    raise AssertionError(f"the simulator logged nothing for {request_id}")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_stream_whose_client_leaves_stops_its_workers_call_on_a_cluster(
    stack: Stack,
) -> None:
    """The edge and the worker are separate processes: the edge's cancel reaches the worker
    through the cancel channel (Redis pub/sub, ``keys.cancels``), which a cluster carries from
    whichever node the edge publishes on to the one the worker listens on."""
    prompt = _long_prompt()
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{stack.base_url}/v1/chat/completions",
            json={
                "model": SMALL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 300,
                "stream": True,
            },
            headers={"Authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"},
        )
        request_id = response.headers["x-request-id"]
        chunks = 0
        async for line in response.content:
            chunks += line.startswith(b"data: {")
            if chunks == 5:
                break
        response.close()  # the client goes away mid-stream
    call = await asyncio.to_thread(_sim_call, stack.usage, request_id)
    assert call["finish_reason"] == "abort", call  # the worker's backend call was stopped
    entry = await wait_entry(stack.database_url, request_id, timeout_s=15)
    assert (entry.status_code, entry.outcome) == (499, "client_disconnected"), entry
    assert 4 <= entry.completion_tokens < 250, entry


def _long_prompt() -> str:
    """A prompt whose simulated answer is long (the simulator's answers are deterministic)."""
    for n in range(1000):
        text = f"Tell me a long story, number {n}."
        if len(answer_pieces([Message("user", text)], None)) >= 250:
            return text
    raise AssertionError("no long answer found")
