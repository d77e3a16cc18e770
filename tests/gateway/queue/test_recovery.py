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
