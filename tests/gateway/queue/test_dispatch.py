"""The edge's side of the queue, against a real Redis: admission, deadlines, claims."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from gateway.accounting.records import LedgerEntry
from gateway.auth.directory import TenantDirectory
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.coalescer import NoCoalescer
from gateway.errors import DeadlineExceeded, RateLimited, ServiceUnavailable
from gateway.observability.tracing import Tracing
from gateway.queue.client.connection import redis_client
from gateway.queue.edge.dispatcher import EDGE_CLAIM, Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.pool import BackendPool
from gateway.queue.running.replying import KeepsNoAnswers, NoLocalEdge
from gateway.queue.running.worker import Worker
from router.catalog import Catalog, Tier
from router.plan import RoutePlan
from tests.gateway.queue.conftest import bare_executor


class _Collect:
    """Stands in for the ledger writer: keeps what the worker books."""

    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []

    async def write(
        self,
        entry: LedgerEntry,
        *,
        then: Callable[[], None] | None = None,
        sql_fallback: bool = True,
    ) -> None:
        self.entries.append(entry)
        if then is not None:
            then()


@pytest.fixture
async def redis_conn(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _job(request_id: str, edge: str, *, timeout_s: float, tenant: str = "acme") -> Job:
    now = time.time()
    return Job(
        request_id=request_id,
        tenant=tenant,
        principal=tenant,
        reply_to=edge,
        plan=RoutePlan(tier=Tier.SMALL, deployments=("m",), rule="pin:tier", reason="test"),
        body={"messages": [{"role": "user", "content": "hi"}]},
        stream=False,
        enqueued_at=now,
        deadline=now + timeout_s,
        received_at=now,
    )


async def test_deadline_without_worker_is_504_and_the_edge_owns_it(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e1"), block_ms=100)
    replies.start()
    try:
        dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=10, claim_ttl_s=60)
        stream = await dispatcher.submit(_job("r1", "e1", timeout_s=0.3))
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await anext(stream)
        assert 0.25 < time.monotonic() - started < 1.5
        assert await redis_conn.get(keys.claim("small", "r1")) == EDGE_CLAIM.encode()

        # A worker that comes later finds the job claimed: it neither runs nor books it.
        booked = _Collect()
        worker = Worker(
            redis=redis_conn,
            blocking_redis=redis_conn,
            keys=keys,
            executor=bare_executor(BackendPool({}), Catalog(())),
            ledger=booked,
            capacity={"small": 2},
            worker_id="w1",
            claim_ttl_s=60,
            pool=BackendPool({}),
            answers=KeepsNoAnswers(),
            coalescer=NoCoalescer(),
            tracing=Tracing.off(),
            local_edge=NoLocalEdge(),
        )
        worker.start()
        stream = keys.jobs("small", "standard", "acme")
        for _ in range(50):
            if await redis_conn.xlen(stream) == 0:
                break
            await asyncio.sleep(0.05)
        await worker.aclose()
        assert await redis_conn.xlen(stream) == 0  # taken, acked and deleted
        assert await redis_conn.get(keys.depth("small", "standard")) == b"0"
        assert booked.entries == []
    finally:
        await replies.aclose()


async def test_worker_that_claims_first_answers_and_books(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """No deployment of the plan is in the pool: the worker answers 502 and books it once."""
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e2"), block_ms=100)
    replies.start()
    booked = _Collect()
    worker = Worker(
        redis=redis_conn,
        blocking_redis=redis_conn,
        keys=keys,
        executor=bare_executor(BackendPool({}), Catalog(())),
        ledger=booked,
        capacity={"small": 2},
        worker_id="w2",
        claim_ttl_s=60,
        pool=BackendPool({}),
        answers=KeepsNoAnswers(),
        coalescer=NoCoalescer(),
        tracing=Tracing.off(),
        local_edge=NoLocalEdge(),
    )
    worker.start()
    try:
        dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=10, claim_ttl_s=60)
        stream = await dispatcher.submit(_job("r2", "e2", timeout_s=5))
        reply: Reply = await anext(stream)
        assert reply.kind == "error"
        assert reply.meta.status == 502
        assert reply.data["error"]["code"] == "upstream_error"
        await asyncio.sleep(0.1)
        assert [e.request_id for e in booked.entries] == ["r2"]
        assert booked.entries[0].outcome == "upstream_error"
        assert await redis_conn.get(keys.claim("small", "r2")) == b"done:w2"
    finally:
        await worker.aclose()
        await replies.aclose()


async def test_full_queue_is_429(redis_conn: aioredis.Redis, key_prefix: str) -> None:
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e3"), block_ms=100)
    replies.start()
    try:
        dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=2, claim_ttl_s=60)
        await dispatcher.submit(_job("a", "e3", timeout_s=5))
        await dispatcher.submit(_job("b", "e3", timeout_s=5))
        with pytest.raises(RateLimited) as info:
            await dispatcher.submit(_job("c", "e3", timeout_s=5))
        assert info.value.code == "queue_full"
        assert info.value.retry_after is not None
    finally:
        await replies.aclose()


async def test_weights_reach_the_lanes_from_the_directory(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """The dispatcher reads a tenant's weight from the directory at each submit: a run-time
    tenant's weight, and its change, reach the lane entries without a new dispatcher."""
    at = datetime.now(UTC)
    directory = TenantDirectory({}, 0.5)

    def reload(weight: float) -> None:
        directory.replace(
            {"umbrella": TenantRecord("umbrella", TenantProfile(weight=weight), at, at)}
        )

    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e5"), block_ms=100)
    replies.start()
    try:
        reload(3.0)
        dispatcher = Dispatcher(
            redis_conn, keys, replies, max_depth=10, claim_ttl_s=60, weights=directory.weights
        )
        await dispatcher.submit(_job("u1", "e5", timeout_s=5, tenant="umbrella"))
        reload(0.5)
        await dispatcher.submit(_job("u2", "e5", timeout_s=5, tenant="umbrella"))
        await dispatcher.submit(_job("a1", "e5", timeout_s=5))  # not in the directory: 1
        entries = await redis_conn.xrange(keys.jobs("small", "standard", "umbrella"))
        assert [float(fields[b"w"]) for _id, fields in entries] == [3.0, 0.5]
        ((_id, fields),) = await redis_conn.xrange(keys.jobs("small", "standard", "acme"))
        assert float(fields[b"w"]) == 1.0
    finally:
        await replies.aclose()


async def test_unreachable_redis_is_503_fast(key_prefix: str) -> None:
    from tests.support import free_port

    client = redis_client(f"redis://127.0.0.1:{free_port()}/0")
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(client, keys.replies("e4"), block_ms=100)
    dispatcher = Dispatcher(client, keys, replies, max_depth=2, claim_ttl_s=60)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        await dispatcher.submit(_job("x", "e4", timeout_s=5))
    assert time.monotonic() - started < 1.0
    await client.aclose()


async def test_a_deadline_timer_that_wakes_early_never_takes_a_non_streamed_job_over(
    redis_conn: aioredis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's clock and the wall clock differ by milliseconds, so the deadline's timer may
    fire while ``time.time()`` is still short of it. That wake must not run the stream watch on
    a non-streamed job: a job whose worker died was answered 502 "the worker running the
    request stopped" at the deadline instead of 504 at the deadline plus the grace (CI)."""
    wall, start = time.time, time.time()
    monkeypatch.setattr(  # a wall clock 10 % slower than the loop's: every timer wakes early
        "gateway.queue.edge.dispatcher.time",
        type("Slow", (), {"time": staticmethod(lambda: start + (wall() - start) * 0.9)}),
    )
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e5"), block_ms=100)
    replies.start()
    try:
        dispatcher = Dispatcher(redis_conn, keys, replies, max_depth=10, claim_ttl_s=60)
        the_job = _job("r5", "e5", timeout_s=0.3)
        stream = await dispatcher.submit(the_job)
        await redis_conn.set(keys.claim("small", "r5"), "w-dead", ex=60)  # no heartbeat
        with pytest.raises(TimeoutError):  # still waiting: the worker's run books it
            await asyncio.wait_for(anext(stream), timeout=1.5)
        assert await redis_conn.get(keys.claim("small", "r5")) == b"w-dead"
    finally:
        await replies.aclose()
