"""Outlier ejection in the worker's pool: of a deployment's three replicas (simulators over real
HTTP, real Redis slot leases), one answers every call with a 500 while its ``/health`` is fine.
After three failures in a row it is ejected: calls go only to the other two and every request
is answered; once its cool-down is over (an injected clock) it gets a single trial call, which
ejects it again for twice as long while it still fails, and puts it back once it answers.
When every replica fails, the last one usable is never ejected: the deployment's calls still
fail on it, for the deployment's own circuit breaker to judge. Failures that ejection answers for
(a replica failing while others are usable) are not the breaker's: one bad pod of three does not
open its deployment's breaker, however few calls the deployment has."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import redis.asyncio as aioredis

from backends.openai_http import VLLMBackend
from gateway.faults.breaker import BreakerConfig, BreakerState, RedisBreaker
from gateway.faults.chains import TierFaults
from gateway.faults.policy import RetryPolicy
from gateway.metrics import Metrics
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.ejection import EjectionPolicy, Ejections
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from router.catalog import Catalog, DeploymentSpec, Tier
from tests.gateway.queue.conftest import (
    MODEL,
    CountingSim,
    bare_executor,
    outcomes,
    plan_job,
    run_job,
)

TIER = TierFaults(retry=RetryPolicy(max_attempts=4, backoff_initial_s=0.0, jitter_s=0.0))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    executor: Executor
    metrics: Metrics
    clock: Clock
    session: aiohttp.ClientSession

    def ejections(self) -> float | None:
        """``tiergate_replica_ejections_total`` of the deployment."""
        labels = {"deployment": MODEL}
        return self.metrics.registry.get_sample_value("tiergate_replica_ejections_total", labels)


@asynccontextmanager
async def _rig(
    redis: aioredis.Redis,
    key_prefix: str,
    sims: list[CountingSim],
    faulty: int,
    breaker: RedisBreaker | None = None,
) -> AsyncIterator[Rig]:
    """``sims`` as the replicas of one deployment, the first ``faulty`` answering 500s;
    ``breaker``: the deployments' circuit breaker (``None``: none)."""
    keys = RedisKeys(key_prefix)
    metrics = Metrics()
    clock = Clock()
    async with aiohttp.ClientSession() as session:
        for sim in sims[:faulty]:
            async with session.post(f"{sim.url}/admin/faults", json={"error_status": 500}) as r:
                assert r.status == 200, await r.text()
        replicas = [
            Replica(
                VLLMBackend(name=f"{MODEL}#{i}", base_url=sim.url, session=session),
                sim.capacity,
                slot_key=keys.slots("small", f"{MODEL}#{i}"),
            )
            for i, sim in enumerate(sims)
        ]
        pool = BackendPool(
            {MODEL: replicas},
            leases=SlotLeases(redis),
            owner="w1",
            ejections=Ejections(
                EjectionPolicy(after=3), clock=clock, on_eject=metrics.count_ejection
            ),
        )
        pool.start()
        catalog = Catalog((DeploymentSpec(model=MODEL, tier=Tier.SMALL, max_model_len=16384),))
        executor = bare_executor(pool, catalog, faults={Tier.SMALL: TIER}, breaker=breaker)
        try:
            yield Rig(executor, metrics, clock, session)
        finally:
            await pool.aclose()


async def test_a_failing_replica_is_ejected_and_tried_once_after_its_cool_down(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> None:
    sims = [await start_sim(4, time_scale=0.0, itl_s=0.0) for _ in range(3)]
    bad = sims[0]  # first in the list: the one every tie picks
    async with _rig(redis_conn, key_prefix, sims, faulty=1) as rig:

        async def answered(n: int) -> None:
            for _ in range(n):
                entry, _ = await run_job(rig.executor, plan_job(MODEL, max_tokens=4))
                assert entry.outcome == "ok", outcomes(entry)

        await answered(8)
        assert len(bad.served) == 3  # three in a row, then never again
        assert rig.ejections() == 1
        assert len(sims[1].served) + len(sims[2].served) == 8

        rig.clock.now += 10.0  # the cool-down is over: one trial
        await answered(4)
        assert len(bad.served) == 4
        assert rig.ejections() == 2  # it failed: out again, for 20 s

        rig.clock.now += 15.0
        await answered(4)
        assert len(bad.served) == 4

        async with rig.session.delete(f"{bad.url}/admin/faults"):
            pass
        rig.clock.now += 5.0
        await answered(4)  # its trial answers: it is back (and, idle, first again)
        assert len(bad.served) == 8
        assert rig.ejections() == 2


async def test_the_last_usable_replica_is_never_ejected(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> None:
    sims = [await start_sim(4, time_scale=0.0, itl_s=0.0) for _ in range(3)]
    async with _rig(redis_conn, key_prefix, sims, faulty=3) as rig:
        for _ in range(5):
            entry, _ = await run_job(rig.executor, plan_job(MODEL, max_tokens=4))
            assert entry.outcome != "ok"
            assert {o for _, o in outcomes(entry)} == {"unavailable"}  # every call reached one
        assert rig.ejections() == 2  # two out; the third stays
        assert [len(s.served) for s in sims] == [3, 3, 14]


async def test_a_deployment_whose_replicas_all_fail_still_opens_its_breaker(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> None:
    sims = [await start_sim(4, time_scale=0.0, itl_s=0.0) for _ in range(3)]
    breaker = RedisBreaker(redis_conn, key_prefix, BreakerConfig(min_calls=4, closed_view_s=0))
    async with _rig(redis_conn, key_prefix, sims, faulty=3, breaker=breaker) as rig:
        for _ in range(3):
            entry, _ = await run_job(rig.executor, plan_job(MODEL, max_tokens=4))
            assert entry.outcome != "ok"
        assert rig.ejections() == 2  # two pods out after three failures each ...
        # ... then the last pod's failures are the breaker's: its fourth opened it
        assert await breaker.state(MODEL) is BreakerState.OPEN
        assert [len(s.served) for s in sims] == [3, 3, 4]
        entry, _ = await run_job(rig.executor, plan_job(MODEL, max_tokens=4))
        assert outcomes(entry)[0] == (MODEL, "circuit_open")  # skipped (then tried: the last)


async def test_one_bad_pod_of_three_leaves_a_quiet_deployments_breaker_closed(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> None:
    """A deployment with a call now and then: one answered, then a pod starts failing. Its three
    failures in a row (against one success in the window) would be over the breaker's ratio at
    its minimum of calls; they are the pod's to answer for, and it is ejected instead."""
    sims = [await start_sim(4, time_scale=0.0, itl_s=0.0) for _ in range(3)]
    bad = sims[0]  # first in the list: the one every tie picks
    breaker = RedisBreaker(redis_conn, key_prefix, BreakerConfig(min_calls=4, closed_view_s=0))
    async with _rig(redis_conn, key_prefix, sims, faulty=0, breaker=breaker) as rig:
        entry, _ = await run_job(rig.executor, plan_job(MODEL, max_tokens=4))
        assert outcomes(entry) == [(MODEL, "ok")]
        async with rig.session.post(f"{bad.url}/admin/faults", json={"error_status": 500}) as r:
            assert r.status == 200, await r.text()
        for _ in range(6):
            entry, _ = await run_job(rig.executor, plan_job(MODEL, max_tokens=4))
            assert entry.outcome == "ok", outcomes(entry)
            assert (MODEL, "circuit_open") not in outcomes(entry)
        assert len(bad.served) == 4  # one answer, then three failures in a row: ejected
        assert rig.ejections() == 1
        assert await breaker.state(MODEL) is BreakerState.CLOSED
