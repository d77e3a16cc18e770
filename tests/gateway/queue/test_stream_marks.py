"""Stream marks on the executor's path: only a reclaimed run reads them; a stream's first chunk
never reaches a client in another process before its mark is in Redis; a local one does not wait
for it. Real Redis, the simulator over HTTP."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
import redis.asyncio as aioredis

from backends.openai_http import VLLMBackend
from gateway.coalescer import Coalescer
from gateway.faults.marks import StreamMarks
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from router.catalog import Catalog, DeploymentSpec, Tier
from tests.gateway.queue.conftest import MODEL, CountingSim, bare_executor, job


@dataclasses.dataclass
class Rig:
    executor: Executor
    marks: StreamMarks
    coalescer: Coalescer
    redis: aioredis.Redis
    sim: CountingSim
    prefix: str

    def mark_key(self, request_id: str) -> str:
        return f"{self.prefix}:{{req:{request_id}}}:stream-started"


@pytest.fixture
async def rig(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> AsyncIterator[Rig]:
    sim = await start_sim(4, time_scale=0.0)
    keys = RedisKeys(key_prefix)
    session = aiohttp.ClientSession()
    replica = Replica(
        VLLMBackend(name=f"{MODEL}#0", base_url=sim.url, session=session),
        4,
        slot_key=keys.slots("small", f"{MODEL}#0"),
    )
    pool = BackendPool({MODEL: [replica]}, leases=SlotLeases(redis_conn), owner="w1")
    pool.start()
    coalescer = Coalescer(redis_conn)
    marks = StreamMarks(redis_conn, key_prefix, coalescer=coalescer)
    catalog = Catalog((DeploymentSpec(model=MODEL, tier=Tier.SMALL, max_model_len=16384),))
    executor = bare_executor(pool, catalog, stream_marks=marks)
    yield Rig(executor, marks, coalescer, redis_conn, sim, key_prefix)
    await coalescer.aclose()
    await pool.aclose()
    await session.close()


def stream_job(request_id: str) -> Job:
    return dataclasses.replace(job(request_id, "edge1"), stream=True)


async def test_only_a_reclaimed_run_reads_the_mark(rig: Rig) -> None:
    """A job read for the first time cannot have been started before: a stale mark under its
    id changes nothing. A reclaimed run with the mark ends with the error, calling no model."""
    request_id = f"req_{uuid.uuid4().hex}"
    await rig.redis.set(rig.mark_key(request_id), b"1", ex=60)
    the_job = stream_job(request_id)

    fresh: list[Reply] = []

    async def keep_fresh(reply: Reply) -> None:
        fresh.append(reply)

    entry = await rig.executor.run(the_job, keep_fresh)
    assert entry.outcome == "ok"
    assert fresh[-1].kind == "end"
    assert any(r.kind == "chunk" for r in fresh)
    calls = len(rig.sim.served)
    assert calls == 1

    again: list[Reply] = []

    async def keep_again(reply: Reply) -> None:
        again.append(reply)

    entry = await rig.executor.run(the_job, keep_again, reclaimed=True)
    assert entry.outcome != "ok"
    assert [r.kind for r in again] == ["error"]
    assert len(rig.sim.served) == calls  # the rerun called no model


async def test_a_remote_first_chunk_leaves_after_its_mark(rig: Rig) -> None:
    request_id = f"req_{uuid.uuid4().hex}"
    seen_at_first_chunk: list[int] = []

    async def emit(reply: Reply) -> None:
        if reply.kind == "chunk" and not seen_at_first_chunk:
            seen_at_first_chunk.append(await rig.redis.exists(rig.mark_key(request_id)))

    entry = await rig.executor.run(stream_job(request_id), emit)
    assert entry.outcome == "ok"
    assert seen_at_first_chunk == [1]


async def test_a_local_stream_is_marked_without_waiting(rig: Rig) -> None:
    """The client waits in this process: its first chunk is handed over before the mark is even
    queued (no round trip before it), and the mark is in Redis once the coalescer has sent it."""
    request_id = f"req_{uuid.uuid4().hex}"
    at_first_chunk: list[tuple[int, int]] = []

    async def emit(reply: Reply) -> None:
        if reply.kind == "chunk" and not at_first_chunk:
            queued = rig.coalescer.pending
            at_first_chunk.append((queued, await rig.redis.exists(rig.mark_key(request_id))))

    entry = await rig.executor.run(stream_job(request_id), emit, local=True)
    assert entry.outcome == "ok"
    assert at_first_chunk == [(0, 0)]
    await rig.coalescer.flush()
    assert await rig.redis.exists(rig.mark_key(request_id)) == 1
