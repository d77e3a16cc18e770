"""Idempotency keys end to end through two edges and a worker: a repeat runs nothing; after a
Redis loss, a repeat of a request that ran is recognised from the SQL ledger and refused."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.accounting import SqlLedger
from gateway.errors import (
    IdempotencyKeyMismatch,
    IdempotencyKeyReused,
    RateLimited,
    ServiceUnavailable,
)
from gateway.limits.idempotency import Idempotency, IdempotencySource, request_fingerprint
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.jobs import Reply
from gateway.queue.keys import RedisKeys
from tests.gateway.accounting.factories import make_entry
from tests.gateway.limits.conftest import lose_redis
from tests.gateway.queue.conftest import Collect, Edge, job, start_node
from tests.support import free_port


async def test_a_repeat_gets_the_first_answer_and_runs_nothing(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    sim = await start_sim(4, itl_s=0.05)
    keys = RedisKeys(key_prefix)
    idem = Idempotency(redis_conn, key_prefix, ttl_s=60)
    edges = []
    for name in ("e1", "e2"):
        replies = ReplyRouter(redis_conn, keys.replies(name), block_ms=200)
        replies.start()
        dispatcher = Dispatcher(
            redis_conn, keys, replies, max_depth=100, claim_ttl_s=60, idempotency=idem
        )
        edges.append(Edge(dispatcher, replies, name))
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1", answers=idem)
    try:
        first = dataclasses.replace(job("r1", "e1"), idempotency_key="k-1")
        repeat = dataclasses.replace(job("r2", "e2"), idempotency_key="k-1", body=first.body)
        other = dataclasses.replace(job("r3", "e2"), idempotency_key="k-2")
        a, b, c = await asyncio.gather(
            edges[0].call(first), edges[1].call(repeat), edges[1].call(other)
        )
        late, _ = await edges[0].call(
            dataclasses.replace(job("r4", "e1"), idempotency_key="k-1", body=first.body)
        )
    finally:
        await node.aclose()
        for e in edges:
            await e.replies.aclose()
    assert a[0].kind == b[0].kind == c[0].kind == late.kind == "result"
    assert b[0].data == a[0].data == late.data  # the same answer
    # whichever claimed the key first ran; the other one is the replay
    assert sorted(x[0].meta.replayed for x in (a, b)) == [False, True]
    assert late.meta.replayed is True
    assert c[0].data != a[0].data
    assert len(sim.served) == 2  # k-1 once, k-2 once
    booked_ids = sorted(e.request_id for e in booked.entries)
    assert booked_ids in (["r1", "r3"], ["r2", "r3"])
    # the rows of the requests that ran carry their keys (how a repeat is known after a loss)
    assert sorted(str(e.idempotency_key) for e in booked.entries) == ["k-1", "k-2"]


async def test_a_key_reused_with_another_body_is_refused_with_422(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 20: the repeat with a different body silently got the first request's answer. The
    IETF Idempotency-Key draft answers 422; it runs nothing and the first answer stands."""
    sim = await start_sim(4)
    keys = RedisKeys(key_prefix)
    idem = Idempotency(redis_conn, key_prefix, ttl_s=60)
    replies = ReplyRouter(redis_conn, keys.replies("e1"), block_ms=200)
    replies.start()
    edge = Edge(
        Dispatcher(redis_conn, keys, replies, max_depth=100, claim_ttl_s=60, idempotency=idem),
        replies,
        "e1",
    )
    booked = Collect()
    node = await start_node(redis_conn, keys, [sim], booked, "w1", answers=idem)
    try:
        first = dataclasses.replace(job("r1", "e1"), idempotency_key="k-1")
        answer, _ = await edge.call(first)
        other = dataclasses.replace(job("r2", "e1"), idempotency_key="k-1")  # "hello r2"
        with pytest.raises(IdempotencyKeyMismatch, match="r1") as refused:
            await edge.call(other)
        # the same body with its keys in another order is the same request: replayed
        same = dataclasses.replace(
            job("r3", "e1"), idempotency_key="k-1", body=dict(reversed(first.body.items()))
        )
        replayed, _ = await edge.call(same)
    finally:
        await node.aclose()
        await replies.aclose()
    error = refused.value
    assert (error.status, error.code, error.retryable) == (422, "idempotency_key_mismatch", False)
    assert replayed.meta.replayed is True and replayed.data == answer.data
    assert len(sim.served) == 1  # only the first ran
    assert [e.request_id for e in booked.entries] == ["r1"]


def test_the_fingerprint_covers_model_stream_and_body() -> None:
    base = job("r1", "e1")
    same = dataclasses.replace(job("r2", "e1"), body=dict(base.body))
    assert request_fingerprint(base) == request_fingerprint(same)
    changed = [
        dataclasses.replace(base, body={**base.body, "max_tokens": 9}),
        dataclasses.replace(base, stream=True),
        dataclasses.replace(base, plan=dataclasses.replace(base.plan, requested_model="large")),
    ]
    assert len({request_fingerprint(j) for j in [base, *changed]}) == 4


# --- after a Redis loss: keys recognised from the SQL ledger ----------------------------------


class CountingLookups:
    """The real ledger, with its key lookups counted."""

    def __init__(self, ledger: IdempotencySource) -> None:
        self.ledger = ledger
        self.calls = 0

    async def idempotent_request(self, tenant: str, key: str, since: datetime) -> str | None:
        self.calls += 1
        return await self.ledger.idempotent_request(tenant, key, since)


async def _ran(ledger: SqlLedger, request_id: str, key: str, *, ago_s: float, **kw: Any) -> None:
    at = datetime.now(UTC) - timedelta(seconds=ago_s)
    assert await ledger.record(make_entry(request_id, created_at=at, idempotency_key=key, **kw))


async def test_after_a_redis_loss_a_key_that_ran_is_refused_not_run_again(
    redis_conn: aioredis.Redis, key_prefix: str, sql_ledger: SqlLedger
) -> None:
    lookups = CountingLookups(sql_ledger)
    idem = Idempotency(redis_conn, key_prefix, ttl_s=300, ledger=lookups)
    assert await idem.claim("acme", "k-1", "req_first") is None
    # it ran and was booked; then Redis lost everything
    await _ran(sql_ledger, "req_first", "k-1", ago_s=5)
    await _ran(sql_ledger, "req_old", "k-old", ago_s=400)  # before the key's lifetime
    await _ran(sql_ledger, "req_globex", "k-2", ago_s=5, tenant="globex")
    await lose_redis(redis_conn, key_prefix)
    calls = lookups.calls

    with pytest.raises(IdempotencyKeyReused, match="req_first") as refused:
        await idem.claim("acme", "k-1", "req_repeat")
    assert refused.value.status == 409 and refused.value.code == "idempotency_key_reused"
    assert lookups.calls == calls + 1
    # the key is back in Redis: the next repeat is refused without SQL
    assert await idem.claim("acme", "k-1", "req_repeat2") == "req_first"
    with pytest.raises(IdempotencyKeyReused, match="req_first"):
        await idem.wait("acme", "k-1", deadline=time.time() + 1)
    assert lookups.calls == calls + 1

    # a key older than its lifetime, and another tenant's key, are new: claimed and run
    assert await idem.claim("acme", "k-old", "req_new") is None
    assert await idem.claim("acme", "k-2", "req_mine") is None  # globex's k-2 is not acme's
    assert await idem.claim("acme", "k-2", "req_again") == "req_mine"


async def test_no_sql_while_redis_remembers_the_whole_key_lifetime(
    redis_conn: aioredis.Redis, key_prefix: str, sql_ledger: SqlLedger
) -> None:
    lookups = CountingLookups(sql_ledger)
    idem = Idempotency(redis_conn, key_prefix, ttl_s=60, ledger=lookups)
    assert await idem.claim("acme", "k-1", "r1") is None  # first ever: looked up once
    assert lookups.calls == 1
    # Redis has remembered acme's keys for longer than a key lives: a missing key is new
    await redis_conn.set(idem._since("acme"), int(time.time()) - 61)
    for i in range(5):
        assert await idem.claim("acme", f"fresh-{i}", f"r{i}") is None
    assert await idem.claim("acme", "fresh-0", "r9") == "r0"
    assert lookups.calls == 1


async def test_sql_down_after_a_loss_answers_503_and_claims_nothing(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    down = await SqlLedger.connect(
        f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/test", migrate=False
    )
    try:
        idem = Idempotency(redis_conn, key_prefix, ttl_s=60, ledger=down)
        with pytest.raises(ServiceUnavailable):
            await idem.claim("acme", "k-1", "r1")
        assert await redis_conn.get(idem._key("acme", "k-1")) is None
    finally:
        await down.aclose()


async def test_a_key_cannot_name_another_keys_stored_answer(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    idem = Idempotency(redis_conn, key_prefix, ttl_s=60)
    assert await idem.claim("acme", "abc", "req_1") is None  # the first: runs
    await idem.store("acme", "abc", Reply("req_1", "result", {"answer": 1}))
    # A client key that spells the first key's answer is a new key of its own.
    assert await idem.claim("acme", "abc:result", "req_2") is None
    assert await idem.claim("acme", "r:abc", "req_3") is None
    assert await idem.claim("acme", "abc", "req_4") == "req_1"


async def test_a_keyed_request_refused_before_it_ran_frees_its_key(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    idem = Idempotency(redis_conn, key_prefix, ttl_s=60)
    replies = ReplyRouter(redis_conn, keys.replies("e1"), block_ms=200)
    full = Dispatcher(redis_conn, keys, replies, max_depth=0, claim_ttl_s=60, idempotency=idem)
    refused = dataclasses.replace(job("r1", "e1"), idempotency_key="k-1")
    with pytest.raises(RateLimited):  # queue_full
        await full.submit(refused)
    # The retry is a first request again (it would have waited for an answer never coming).
    assert await idem.claim(refused.tenant, "k-1", "r2") is None
    # A release never removes another request's claim.
    await idem.release(refused.tenant, "k-1", "r1")
    assert await idem.claim(refused.tenant, "k-1", "r3") == "r2"
