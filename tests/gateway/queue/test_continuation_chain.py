"""A stream that broke after its first tokens is continued down its chain: a deployment that
refuses the continuation for its context window passes it on to the next (as a fresh request
over one window moves on), instead of ending the stream. The executor on real HTTP (three
simulated vLLM deployments), real Redis slot leases."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from backends.errors import ContextLengthExceeded
from backends.openai_http import VLLMBackend
from backends.sim import PROFILES, create_sim_app
from gateway.accounting.prices import PriceBook
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from router.catalog import Catalog, DeploymentSpec, Tier
from router.plan import RoutePlan
from tests.gateway.queue.conftest import MODEL, bare_executor, job

CUT, NARROW, WIDE = "vllm-cut", "vllm-narrow", "vllm-wide"


@dataclasses.dataclass
class Sims:
    urls: dict[str, str]


@pytest.fixture
async def sims() -> AsyncIterator[Sims]:
    """Three replicas of the 8B profile under their own names; ``NARROW`` serves a window too
    small for any request here (its server refuses, though the catalog says otherwise)."""
    runners: list[web.AppRunner] = []
    urls: dict[str, str] = {}
    for name, window in ((CUT, 16384), (NARROW, 64), (WIDE, 16384)):
        profile = dataclasses.replace(PROFILES[MODEL], name=name, max_model_len=window, itl_s=0)
        runner = web.AppRunner(create_sim_app(profile, time_scale=0.0))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        urls[name] = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        faults = {"cut_after_tokens": 10}
        async with http.post(f"{urls[CUT]}/admin/faults", json=faults) as response:
            assert response.status == 200, await response.text()
    yield Sims(urls)
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def executor(sims: Sims, redis_url: str, key_prefix: str) -> AsyncIterator[Executor]:
    redis = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(key_prefix)
    session = aiohttp.ClientSession()
    pool = BackendPool(
        {
            name: [
                Replica(
                    VLLMBackend(name=f"{name}#0", base_url=url, session=session),
                    4,
                    slot_key=keys.slots("small", f"{name}#0"),
                )
            ]
            for name, url in sims.urls.items()
        },
        leases=SlotLeases(redis),
        owner="w1",
    )
    pool.start()
    catalog = Catalog(
        tuple(DeploymentSpec(model=n, tier=Tier.SMALL, max_model_len=16384) for n in sims.urls)
    )
    yield bare_executor(pool, catalog, PriceBook({}))
    await pool.aclose()
    await session.close()
    await redis.aclose()


def a_stream() -> Job:
    base = job(f"req_{uuid.uuid4().hex}", "edge1", max_tokens=120)
    plan = RoutePlan(
        tier=Tier.SMALL, deployments=(CUT, NARROW, WIDE), rule="pin:tier", reason="test"
    )
    return dataclasses.replace(base, plan=plan, stream=True)


async def test_a_window_that_refuses_the_continuation_passes_it_on(executor: Executor) -> None:
    replies: list[Reply] = []

    async def emit(reply: Reply) -> None:
        replies.append(reply)

    entry = await executor.run(a_stream(), emit)
    assert [(a.deployment, a.outcome) for a in entry.attempts] == [
        (CUT, "stream_cut"),
        (NARROW, ContextLengthExceeded.kind),
        (WIDE, "ok"),
    ]
    assert (entry.outcome, entry.status_code) == ("ok", 200)
    assert entry.deployment == WIDE  # it finished the answer
    assert replies[-1].kind == "end"  # a clean end, no error event
