"""Job ownership as a table (``gateway.queue.ownership.table``): every row walked against the real
Redis steps (commands and Lua scripts), the races docs/queue.md describes run concurrently,
and the page's table checked against the code's."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.queue.edge.claiming import BooksNoNotes, EdgeClaims
from gateway.queue.jobs import Job
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import HANDED_OFF, Handoff, LaneQueue, Taken
from gateway.queue.ownership.claims import Reclaimed, WorkerClaims
from gateway.queue.ownership.reclaim import Reclaimer
from gateway.queue.ownership.table import (
    EDGE_CLAIM,
    TRANSITIONS,
    ClaimState,
    EdgeTakeOver,
    OwnershipScripts,
    Step,
    Transition,
    Verdict,
    state_of,
    table_markdown,
    transition,
)
from tests.gateway.queue.conftest import job

ROOT = Path(__file__).resolve().parents[3]
SELF, LIVE, DEAD = "w-self", "w-live", "w-dead"
_EDGE_VERDICT = {
    EdgeTakeOver.TAKEN: Verdict.ANSWERED_BY_EDGE,
    EdgeTakeOver.EDGE: Verdict.ANSWERED_BY_EDGE,
    EdgeTakeOver.ALIVE: Verdict.OWNED_BY_WORKER,
    EdgeTakeOver.FINISHED: Verdict.OWNED_BY_WORKER,
    EdgeTakeOver.FREE: Verdict.OWNED_BY_WORKER,
}


class Rig:
    def __init__(self, redis: aioredis.Redis, keys: RedisKeys) -> None:
        self.redis, self.keys = redis, keys
        self.claims = WorkerClaims(
            redis, keys, Reclaimer(redis, keys, min_idle_ms=0), worker_id=SELF, ttl_s=60
        )
        self.scripts = OwnershipScripts(redis)
        self.edge = EdgeClaims(redis, keys, claim_ttl_s=60, noted=BooksNoNotes(), local=None)

    def claim(self, j: Job) -> str:
        return self.keys.claim("small", j.request_id)

    async def arrange(self, j: Job, row: Transition) -> None:
        await self.redis.set(self.keys.tier_heartbeat("small", LIVE), "small", ex=60)
        value = {
            ClaimState.FREE: None,
            ClaimState.EDGE: EDGE_CLAIM,
            ClaimState.FINISHED: "done:w-earlier",
            ClaimState.RUNNING: {"self": SELF, "live": LIVE, "dead": DEAD}.get(row.owner),
        }[row.before]
        if value is not None:
            await self.redis.set(self.claim(j), value, ex=60)

    async def entry(self, j: Job) -> Taken:
        stream = self.keys.jobs("small", "standard", "acme")
        await self.redis.xgroup_create(stream, self.keys.group, "0", mkstream=True)
        await self.redis.xadd(stream, {"j": j.encode()})
        got = await self.redis.xreadgroup(self.keys.group, SELF, {stream: ">"}, count=1)
        entry_id = got[0][1][0][0]
        return Taken("small", "standard", "acme", entry_id, j.encode())

    async def act(self, j: Job, row: Transition) -> Verdict:
        step = row.step
        if step is Step.WORKER_STARTS:
            return await self.claims.own("small", j, None)
        if step is Step.TAKE_OVER:
            return await self.claims.own("small", j, Reclaimed())
        if step is Step.EDGE_GIVES_UP:
            claimed = await self.edge.take(j)
            return Verdict.ANSWERED_BY_EDGE if claimed.edge else Verdict.OWNED_BY_WORKER
        if step is Step.HAND_BACK:
            released = await self.claims.release("small", j)
            return Verdict.RELEASED if released else Verdict.NOT_OURS
        if step is Step.FINISH:
            taken = await self.entry(j)
            async with self.redis.pipeline(transaction=False) as pipe:
                self.claims.finish(pipe, taken, j)
                await pipe.execute()
            stream = self.keys.jobs("small", "standard", "acme")
            assert await self.redis.xlen(stream) == 0  # acknowledged and deleted
            return Verdict.FINISHED
        if step is Step.EDGE_TAKES_OVER:
            found = await self.scripts.edge_take_over(
                self.claim(j), heartbeat_prefix=self.keys.tier_heartbeat("small", ""), ttl_s=60
            )
            assert found is not None
            return _EDGE_VERDICT[found]
        assert step is Step.HANDED_OVER
        lanes = LaneQueue(self.redis, self.keys)
        assert await lanes.take("small", SELF, slot_keys=[], batch_limit=-1, idle_ms=5000) is None
        depth = await lanes.enqueue(
            tier="small", lane="standard", tenant="acme", job=j.encode(), weight=1.0,
            max_depth=100, handoff=Handoff(j.request_id, 60),
        )  # fmt: skip
        return Verdict.RUN if depth == HANDED_OFF else Verdict.OTHER_WORKER


@pytest.fixture
def rig(redis_conn: aioredis.Redis, key_prefix: str) -> Rig:
    return Rig(redis_conn, RedisKeys(key_prefix))


@pytest.mark.parametrize(
    "row", TRANSITIONS, ids=[f"{r.step.name}-{r.before}-{r.owner}" for r in TRANSITIONS]
)
async def test_every_transition_of_the_table_is_what_redis_does(rig: Rig, row: Transition) -> None:
    j = job(f"r-{row.step.name}-{row.before}-{row.owner}".lower(), "e")
    await rig.arrange(j, row)
    assert await rig.act(j, row) is row.verdict
    assert state_of(await rig.redis.get(rig.claim(j))) is row.after


def test_the_table_is_complete_and_unambiguous() -> None:
    seen = {(r.step, r.before, r.owner) for r in TRANSITIONS}
    assert len(seen) == len(TRANSITIONS)
    for step in Step:
        assert any(r.step is step for r in TRANSITIONS), step
    assert transition(Step.TAKE_OVER, ClaimState.RUNNING, "dead").verdict is Verdict.RUN
    with pytest.raises(ValueError):
        transition(Step.FINISH, ClaimState.EDGE)


def test_docs_print_the_table_of_the_code() -> None:
    page = (ROOT / "docs" / "queue.md").read_text()
    section = page.split("## Job ownership", 1)[1].split("\n## ", 1)[0]
    tables = re.findall(r"(?m)^\| step \|.*(?:\n\|.*)*", section)
    assert tables == [table_markdown()]


# -- races ------------------------------------------------------------------------------------

ROUNDS = 20


async def _clients(redis_url: str, n: int) -> list[aioredis.Redis]:
    return [aioredis.Redis.from_url(redis_url) for _ in range(n)]


async def test_race_worker_start_against_the_edge_at_the_deadline_has_one_owner(
    redis_url: str, key_prefix: str
) -> None:
    """A worker takes a job as its deadline passes: one ``SET NX`` each, one winner."""
    a, b = await _clients(redis_url, 2)
    keys = RedisKeys(key_prefix)
    try:
        worker = WorkerClaims(a, keys, Reclaimer(a, keys, min_idle_ms=0), worker_id=SELF, ttl_s=60)
        edge = EdgeClaims(b, keys, claim_ttl_s=60, noted=BooksNoNotes(), local=None)
        for n in range(ROUNDS):
            j = job(f"race-{n}", "e")
            verdict, claimed = await asyncio.gather(worker.own("small", j, None), edge.take(j))
            assert (verdict is Verdict.RUN) != claimed.edge
    finally:
        for c in (a, b):
            await c.aclose()


async def test_race_two_reclaimers_take_over_a_dead_workers_job_once(
    redis_url: str, key_prefix: str
) -> None:
    clients = await _clients(redis_url, 3)
    keys = RedisKeys(key_prefix)
    try:
        claims = [
            WorkerClaims(c, keys, Reclaimer(c, keys, min_idle_ms=0), worker_id=f"w{i}", ttl_s=60)
            for i, c in enumerate(clients)
        ]
        for i in range(len(clients)):  # the reclaimers live
            await clients[0].set(keys.tier_heartbeat("small", f"w{i}"), "small", ex=60)
        for n in range(ROUNDS):
            j = job(f"dead-{n}", "e")
            await clients[0].set(keys.claim("small", j.request_id), DEAD, ex=60)
            verdicts = await asyncio.gather(*(c.own("small", j, Reclaimed()) for c in claims))
            assert verdicts.count(Verdict.RUN) == 1
            assert verdicts.count(Verdict.OWNER_ALIVE) == 2
    finally:
        for c in clients:
            await c.aclose()


async def test_race_a_hand_back_against_the_edge_leaves_one_owner(
    redis_url: str, key_prefix: str
) -> None:
    """A worker hands a job back (compare-and-delete) as the edge gives up (``SET NX``): the
    edge either finds the worker's claim (and waits) or takes the released one."""
    a, b, c = await _clients(redis_url, 3)
    keys = RedisKeys(key_prefix)
    try:
        worker = WorkerClaims(a, keys, Reclaimer(a, keys, min_idle_ms=0), worker_id=SELF, ttl_s=60)
        edge = EdgeClaims(b, keys, claim_ttl_s=60, noted=BooksNoNotes(), local=None)
        for n in range(ROUNDS):
            j = job(f"back-{n}", "e")
            await c.set(keys.claim("small", j.request_id), SELF, ex=60)
            released, claimed = await asyncio.gather(worker.release("small", j), edge.take(j))
            assert released
            holder = state_of(await c.get(keys.claim("small", j.request_id)))
            assert holder is (ClaimState.EDGE if claimed.edge else ClaimState.FREE)
    finally:
        for client in (a, b, c):
            await client.aclose()


async def test_race_a_release_never_deletes_another_workers_claim(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """Before: GET then DELETE, so a claim that changed hands between them was deleted."""
    keys = RedisKeys(key_prefix)
    worker = WorkerClaims(
        redis_conn, keys, Reclaimer(redis_conn, keys, min_idle_ms=0), worker_id=SELF, ttl_s=60
    )
    j = job("taken-over", "e")
    await redis_conn.set(keys.claim("small", j.request_id), "w-other", ex=60)
    assert not await worker.release("small", j)
    assert await redis_conn.get(keys.claim("small", j.request_id)) == b"w-other"


async def test_race_a_finished_job_is_never_taken_over(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """Its worker booked, acknowledged and answered it (the claim marked finished); a
    reclaimer that read its entry before the acknowledgement drops it."""
    rig = Rig(redis_conn, RedisKeys(key_prefix))
    j = job("done-race", "e")
    taken = await rig.entry(j)
    async with redis_conn.pipeline(transaction=False) as pipe:
        rig.claims.finish(pipe, taken, j)
        await pipe.execute()
    other = WorkerClaims(
        redis_conn, rig.keys, Reclaimer(redis_conn, rig.keys, min_idle_ms=0), worker_id="w2",
        ttl_s=60,
    )  # fmt: skip
    assert await other.own("small", j, Reclaimed()) is Verdict.ALREADY_FINISHED
    assert await other.own("small", j, Reclaimed(started_by=SELF)) is Verdict.ALREADY_FINISHED
