"""The ledger sink SIGKILLed during real gateway traffic (slow).

An edge (`tiergate serve --no-workers`), a worker without a sink (`tiergate worker --no-sink`)
and the sink alone (`tiergate sink`), three simulators, the real Redis and SQLite. A few hundred
requests across the three example tenants, streamed and not, through the official openai client.
The sink process is SIGKILLed while it holds events it has read but not acknowledged; traffic goes
on, and a new sink process (a new consumer name) is started while it still flows. Then: every
request was answered exactly once, every request id is in the ledger exactly once (and no other),
each row's tokens equal the simulator's usage log for that request (one backend call each) and
what the client was told, the event stream is empty with nothing pending, and `ledger verify`
finds nothing. Slow: the new sink claims the dead one's events once they have been idle 30 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis
from sqlalchemy import func, select

from gateway.accounting import SqlLedger
from gateway.accounting.rollups import rollup_day
from gateway.accounting.schema import ledger_entries
from gateway.accounting.verify import verify_ledger
from gateway.queue.keys import RedisKeys
from tests.support import (
    TEST_KEYS,
    Proc,
    drop_prefix,
    free_port,
    gateway_config,
    new_prefix,
    own_config,
    start_gateway,
    start_sims,
    start_tiergate,
    wait_ready,
)

pytestmark = pytest.mark.slow

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")
TENANTS = ("acme", "globex", "initech")
REQUESTS = 360
RATE = 20
"""Requests started per second: the traffic lasts ~18 s, so it still flows when the new sink
starts."""
CONCURRENCY = 12
KILL_AFTER = 120
"""Answered requests before the sink is killed; the replacement starts 1 s later."""


@dataclass
class Cluster:
    base_url: str
    database_url: str
    config: Path
    workdir: Path
    usage_logs: dict[str, Path]
    client: redis.Redis
    keys: RedisKeys
    sink: Proc


def _process(command: str, config: Path, workdir: Path, name: str, *args: str) -> tuple[Proc, int]:
    """``tiergate <command>`` with its own admin port (returned)."""
    admin_port = free_port()
    own = own_config(config, workdir, name, server={"admin_port": admin_port})
    return start_tiergate(command, own, workdir, name, *args), admin_port


def _start_sink(config: Path, workdir: Path, name: str) -> Proc:
    """``tiergate sink``: the ledger sink alone; its admin port answers once it runs."""
    proc, admin_port = _process("sink", config, workdir, name)
    wait_ready(proc, f"http://127.0.0.1:{admin_port}/healthz")
    return proc


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str) -> Iterator[Cluster]:
    prefix = new_prefix()
    procs: list[Proc] = []
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        ports, usage = start_sims(PROFILES, tmp_path, procs)
        port = free_port()
        database_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
        config = gateway_config(
            workdir=tmp_path, redis_url=redis_url, prefix=prefix, database_url=database_url,
            sim_ports=ports, port=port, admin_port=free_port(),
        )  # fmt: skip
        procs.append(_process("worker", config, tmp_path, "worker", "--no-sink")[0])
        sink = _start_sink(config, tmp_path, "sink-1")
        procs.append(sink)
        edge_config = own_config(config, tmp_path, "edge", server={"admin_port": free_port()})
        edge = start_gateway(edge_config, tmp_path, "--no-workers", name="edge")
        procs.append(edge)
        wait_ready(edge, f"http://127.0.0.1:{port}/readyz")  # needs the worker's heartbeat
        yield Cluster(
            f"http://127.0.0.1:{port}", database_url, config, tmp_path, usage, client,
            RedisKeys(prefix), sink,
        )  # fmt: skip
    finally:
        for proc in reversed(procs):
            proc.stop()
        drop_prefix(redis_url, prefix)
        client.close()


@dataclass(frozen=True)
class Answer:
    request_id: str
    stream: bool
    prompt_tokens: int
    completion_tokens: int


async def _one(client: openai.AsyncOpenAI, i: int, tenant: str) -> Answer:
    model = ("auto", "small", "large", "external")[i % 4]
    if tenant == "initech" and model == "external":  # initech may not use external
        model = "large"
    words = " ".join(["ledger"] * (5 + (i * 7) % 90))
    kwargs = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {i}: summarise {words}"}],
        "max_tokens": 8 + i % 24,
    }
    if i % 2:
        raw = await client.chat.completions.with_raw_response.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in raw.parse()]
        usage = chunks[-1].usage
        assert any(c.choices and c.choices[0].finish_reason for c in chunks), chunks[-3:]
    else:
        raw = await client.chat.completions.with_raw_response.create(**kwargs)
        completion = raw.parse()
        assert completion.choices[0].message.content
        usage = completion.usage
    assert raw.http_response.status_code == 200 and usage is not None
    return Answer(
        raw.headers["x-request-id"], bool(i % 2), usage.prompt_tokens, usage.completion_tokens
    )


def _pending(cluster: Cluster) -> int:
    summary = cluster.client.xpending(cluster.keys.ledger_events, cluster.keys.ledger_group)
    return int(summary["pending"])


async def _kill_while_holding_events(cluster: Cluster) -> int:
    """SIGKILL the sink at a moment it holds events it has read but not acknowledged: freeze it
    (SIGSTOP), look at the group's pending entries (it is the only consumer), kill it if there
    are some, else let it go on and look again. Returns how many it held."""
    pid = cluster.sink.popen.pid
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        held = _pending(cluster)
        if held:
            os.kill(pid, signal.SIGKILL)
            cluster.sink.popen.wait(10)
            return held
        os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.003)
    raise AssertionError("the sink never held unacknowledged events")


def _usage(paths: dict[str, Path]) -> dict[str, list[tuple[int, int]]]:
    calls: dict[str, list[tuple[int, int]]] = {}
    for path in paths.values():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            assert rec["status"] == 200, rec
            calls.setdefault(rec["request_id"], []).append(
                (rec["prompt_tokens"], rec["completion_tokens"])
            )
    return calls


@pytest.mark.timeout(300)
async def test_sink_killed_mid_run_loses_and_duplicates_nothing(cluster: Cluster) -> None:
    clients = {
        t: openai.AsyncOpenAI(
            base_url=f"{cluster.base_url}/v1", api_key=TEST_KEYS[f"TIERGATE_KEY_{t.upper()}"],
            max_retries=0, timeout=60,
        )
        for t in TENANTS
    }  # fmt: skip
    gate = asyncio.Semaphore(CONCURRENCY)
    answered = 0
    enough = asyncio.Event()

    async def run(i: int) -> Answer:
        nonlocal answered
        await asyncio.sleep(i / RATE)
        async with gate:
            tenant = TENANTS[i % 3]
            answer = await _one(clients[tenant], i, tenant)
        answered += 1
        if answered >= KILL_AFTER:
            enough.set()
        return answer

    ledger = await SqlLedger.connect(cluster.database_url)
    replacement: Proc | None = None
    traffic = asyncio.ensure_future(asyncio.gather(*(run(i) for i in range(REQUESTS))))
    waiter = asyncio.ensure_future(enough.wait())
    try:
        await asyncio.wait([traffic, waiter], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if traffic.done():
            traffic.result()  # a request failed: raise it
        assert enough.is_set() and not traffic.done(), "traffic ended before the kill"
        held = await _kill_while_holding_events(cluster)
        killed_at = time.monotonic()
        async with ledger.engine.connect() as conn:
            count = select(func.count()).select_from(ledger_entries)
            booked = (await conn.execute(count)).scalar_one()
        answered_at_kill = answered
        await asyncio.sleep(1.0)  # events pile up in the stream with no sink at all
        replacement = await asyncio.to_thread(
            _start_sink, cluster.config, cluster.workdir, "sink-2"
        )
        answered_at_restart = answered
        assert answered_at_restart < REQUESTS, "the new sink started after the traffic ended"
        answers = await asyncio.wait_for(traffic, 180)

        # Every request answered exactly once: one answer per call, distinct request ids.
        ids = [a.request_id for a in answers]
        assert len(answers) == REQUESTS and len(set(ids)) == REQUESTS
        assert Counter(a.stream for a in answers) == {True: REQUESTS // 2, False: REQUESTS // 2}

        # The new sink books what piled up, then (after 30 s idle) the dead sink's events.
        deadline = time.monotonic() + 90
        while True:
            async with ledger.engine.connect() as conn:
                rows = (await conn.execute(select(ledger_entries))).all()
            left = cluster.client.xlen(cluster.keys.ledger_events)
            if len(rows) >= REQUESTS and left == 0 and _pending(cluster) == 0:
                break
            assert time.monotonic() < deadline, f"{len(rows)} rows, {left} events left"
            await asyncio.sleep(0.25)
        caught_up_s = time.monotonic() - killed_at

        booked_ids = Counter(row.request_id for row in rows)
        assert booked_ids == Counter(ids), "every request id exactly once, and no other"
        calls = _usage(cluster.usage_logs)
        assert Counter(len(v) for v in calls.values()) == {1: REQUESTS}  # one backend call each
        assert set(calls) == set(ids)
        by_id = {a.request_id: a for a in answers}
        wrong = {
            row.request_id: ((row.prompt_tokens, row.completion_tokens), calls[row.request_id])
            for row in rows
            if row.outcome != "ok"
            or [(row.prompt_tokens, row.completion_tokens)] != calls[row.request_id]
            or (by_id[row.request_id].prompt_tokens, by_id[row.request_id].completion_tokens)
            != (row.prompt_tokens, row.completion_tokens)
        }
        assert wrong == {}, wrong

        for day in {row.created_at.date() for row in rows}:
            await rollup_day(ledger, day)
        check = await verify_ledger(ledger)
        assert check.ok, check.differences
    finally:
        for task in (traffic, waiter):
            if not task.done():
                task.cancel()
        await asyncio.gather(traffic, waiter, return_exceptions=True)
        for c in clients.values():
            await c.close()
        await ledger.aclose()
        if replacement is not None:
            replacement.stop()
    print(
        f"sink killed after {answered_at_kill} answers holding {held} unacknowledged events "
        f"({booked} rows booked), the new one up after {answered_at_restart} answers; all "
        f"{REQUESTS} rows, each once, {caught_up_s:.1f} s after the kill"
    )
