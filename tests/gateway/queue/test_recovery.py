"""Crash recovery: a worker killed mid-job (SIGKILL, a real process); another reclaims the job
and finishes it; the client gets one answer, the ledger one row, the replica stays in capacity."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.errors import GatewayError
from gateway.queue.keys import RedisKeys
from gateway.queue.ownership.reclaim import Reclaimer
from tests.gateway.queue.conftest import Collect, Edge, job, start_node
from tests.support import until

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
async def test_a_killed_workers_job_is_reclaimed_and_answered_once(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    sim = await start_sim(2, itl_s=0.25)  # 8 tokens: ~2 s per request
    keys = RedisKeys(key_prefix)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.queue.worker_proc", redis_url, key_prefix,
        sim.url, "doomed",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready"
        answer = asyncio.create_task(edge.call(job("r1", edge.edge_id, timeout_s=30)))
        await until(lambda: sim.now == 1, 10)  # the doomed worker is calling the replica
        assert await redis_conn.get(keys.claim("small", "r1")) == b"doomed"
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    booked = Collect()
    survivor = await start_node(
        redis_conn, keys, [sim], booked, "survivor", reclaim_idle_s=1.5, heartbeat_s=0.3
    )
    try:
        reply, _wait = await asyncio.wait_for(answer, 20)
    finally:
        await survivor.aclose()
    assert reply.kind == "result"
    assert [e.request_id for e in booked.entries] == ["r1"]
    assert await redis_conn.get(keys.claim("small", "r1")) == b"done:survivor"
    assert sim.peak <= 2
    stream = keys.jobs("small", "standard", "acme")
    assert await redis_conn.xlen(stream) == 0  # acknowledged and deleted once finished


async def test_a_live_workers_claim_is_left_alone_until_its_heartbeat_goes(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    sim = await start_sim(2)
    keys = RedisKeys(key_prefix)
    reclaimer = Reclaimer(redis_conn, keys, min_idle_ms=1000)
    node = await start_node(redis_conn, keys, [sim], Collect(), "w-live", heartbeat_s=2.0)
    try:
        # Its heartbeat for the tier sits in the tier's slot, beside the claim keys.
        beat = keys.tier_heartbeat("small", "w-live")
        assert "{q:small}" in beat and "{q:small}" in keys.claim("small", "r-x")
        await until(lambda: redis_conn.exists(beat), 5)
        await redis_conn.set(keys.claim("small", "r-x"), "w-live", ex=60)
        await redis_conn.delete(keys.worker_heartbeat("w-live"))  # readiness's: not the one read
        assert await reclaimer.take_over("small", "r-x", "w-other", 60) == "alive"
    finally:
        await node.aclose()  # stops beating: its heartbeats are deleted
    assert not await redis_conn.exists(beat)
    assert await reclaimer.take_over("small", "r-x", "w-other", 60) == "mine"
    assert await redis_conn.get(keys.claim("small", "r-x")) == b"w-other"


@pytest.mark.slow
async def test_a_stream_whose_worker_died_ends_soon_with_an_error_and_never_runs_again(
    redis_conn: aioredis.Redis,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    """Before: the client of a stream whose worker died mid-way waited until its deadline plus
    the grace (25 s here) for an error. Now the edge sees the silence, finds the worker's
    heartbeat gone, takes the claim and ends the stream with an error event within seconds;
    a worker that finds the job later drops it."""
    sim = await start_sim(2, itl_s=0.5)  # 8 tokens: ~4 s
    keys = RedisKeys(key_prefix)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.queue.worker_proc", redis_url, key_prefix,
        sim.url, "doomed",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready"
        j = dataclasses.replace(job("r1", edge.edge_id, timeout_s=20), stream=True)
        stream = await edge.dispatcher.submit(j)
        first = await asyncio.wait_for(anext(stream), 10)
        assert first.kind == "chunk"
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    killed_at = time.monotonic()
    served = list(sim.served)
    with pytest.raises(GatewayError) as ended:
        async for _reply in stream:
            pass
    assert time.monotonic() - killed_at < 6.0
    assert ended.value.code == "stream_error"  # after chunks: an error event, booked so
    assert await redis_conn.get(keys.claim("small", "r1")) == b"edge"
    booked = Collect()
    survivor = await start_node(
        redis_conn, keys, [sim], booked, "survivor", reclaim_idle_s=1.5, heartbeat_s=0.3
    )
    try:
        await asyncio.sleep(3.0)  # its entry is reclaimed: the edge's claim, dropped
    finally:
        await survivor.aclose()
    assert sim.served == served  # never run again
    assert booked.entries == []  # the edge books it (from the dead run's note)


async def test_an_orphan_behind_many_live_entries_is_found(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """``XAUTOCLAIM … COUNT 1`` looks at ten pending entries and returns a cursor: an orphan
    behind ten live ones (renewed by their worker) must still be found in the same call. Before,
    the cursor was dropped and the orphan waited until the entries before it were acknowledged
    (seen in the chaos bench: jobs of a killed worker taken over 55-90 s late)."""
    keys = RedisKeys(key_prefix)
    stream = keys.jobs("small", "standard", "acme")
    await redis_conn.xgroup_create(stream, keys.group, id="0", mkstream=True)
    ids = [await redis_conn.xadd(stream, {"j": str(i)}) for i in range(25)]
    await redis_conn.xreadgroup(keys.group, "w-live", {stream: ">"}, count=100)
    orphan = ids[20]
    await redis_conn.xclaim(stream, keys.group, "w-dead", 0, [orphan], idle=60_000, justid=True)
    reclaimer = Reclaimer(redis_conn, keys, min_idle_ms=15_000)
    found = await reclaimer.orphans(stream, "w-other")
    assert [entry_id for entry_id, _fields in found] == [orphan]
    assert (await reclaimer.orphans(stream, "w-other")) == []  # now fresh: nothing idle left


async def test_a_new_worker_takes_over_a_dead_workers_job_at_once(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    edge: Edge,
) -> None:
    """A worker that starts (a supervisor replacing one that crashed) looks for orphans at once,
    not after its first ``reclaim_idle_s / 2``: in the chaos bench, where workers were killed
    every ~20 s, most replacements died before their first look and a dead worker's jobs
    waited 45-67 s for one that lived long enough."""
    sim = await start_sim(2)
    keys = RedisKeys(key_prefix)
    answer = asyncio.create_task(edge.call(job("r-orphan", edge.edge_id, timeout_s=30)))
    stream = keys.jobs("small", "standard", "acme")
    await until(lambda: redis_conn.exists(stream), 5)
    # A worker that took the job and died: its entry pending (and long idle), its claim, no
    # heartbeat.
    await redis_conn.xreadgroup(keys.group, "w-dead", {stream: ">"}, count=10)
    ((entry_id, _fields),) = await redis_conn.xrange(stream)
    await redis_conn.xclaim(stream, keys.group, "w-dead", 0, [entry_id], idle=60_000, justid=True)
    await redis_conn.set(keys.claim("small", "r-orphan"), "w-dead", ex=60)
    booked = Collect()
    started = time.monotonic()
    node = await start_node(redis_conn, keys, [sim], booked, "w-new", reclaim_idle_s=10.0)
    try:
        reply, _wait = await asyncio.wait_for(answer, 4)  # its first look was at 5 s
    finally:
        await node.aclose()
    assert reply.kind == "result"
    assert time.monotonic() - started < 4
    assert [e.request_id for e in booked.entries] == ["r-orphan"]
