"""Crash recovery: a worker killed mid-job (SIGKILL, a real process); another reclaims the job
and finishes it; the client gets one answer, the ledger one row, the replica stays in capacity."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from gateway.queue.reclaim import Reclaimer
from tests.gateway.queue.conftest import Collect, Edge, job, start_node, until

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
    assert await redis_conn.get(keys.claim("small", "r1")) == b"survivor"
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
        assert await reclaimer.take_over("small", "r-x", "w-other", 60, "edge") == "alive"
    finally:
        await node.aclose()  # stops beating: its heartbeats are deleted
    assert not await redis_conn.exists(beat)
    assert await reclaimer.take_over("small", "r-x", "w-other", 60, "edge") == "mine"
    assert await redis_conn.get(keys.claim("small", "r-x")) == b"w-other"
