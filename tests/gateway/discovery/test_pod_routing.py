"""Per-pod routing through the whole gateway: the spot pool's pods are found through a fake
Kubernetes API, each pod a simulator with 2 slots of its own. Scaling 1 -> 3 -> 0 pods: each
pod's slots hold (never more than 2 calls at once on one), new pods take work within seconds, a
pod that leaves finishes the call it runs, a pod killed mid-call has its call failed over, and
with no pod left the tier's on-demand pool answers. Every request gets one ledger row, naming
the deployment that answered it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from backends.sim import PROFILES, create_sim_app
from gateway.services import Services
from tests.gateway.discovery.fake_kube import FakeKube, Pod
from tests.inprocess import SMALL, inprocess_gateway
from tests.support import until

SPOT = "llama-3.1-8b-instruct-spot"
SLOTS = 2


@dataclass
class PodSim:
    port: int
    runner: web.AppRunner
    now: int = 0
    peak: int = 0
    served: list[str] = field(default_factory=list)


async def _start_pod() -> PodSim:
    profile = dataclasses.replace(PROFILES[SMALL], name=SPOT, max_num_seqs=SLOTS, itl_s=0.02)
    app = create_sim_app(profile, time_scale=1.0)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
    pod = PodSim(0, runner)

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/v1/chat/completions":
            return await handler(request)
        pod.now += 1
        pod.peak = max(pod.peak, pod.now)
        try:
            return await handler(request)
        finally:
            pod.now -= 1
            pod.served.append(request.headers.get("x-request-id", ""))

    app.middlewares.append(count)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    pod.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return pod


@pytest.fixture
async def pods() -> AsyncIterator[dict[str, PodSim]]:
    started = {name: await _start_pod() for name in ("a", "b", "c", "d")}
    yield started
    for pod in started.values():
        await pod.runner.cleanup()


def _with_spot_pool(api: dict[str, Any]) -> Any:
    def edit(config: dict[str, Any]) -> None:
        config["kubernetes"] = api
        config["deployments"].insert(
            0,
            {
                "model": SPOT,
                "tier": "small",
                "max_model_len": 16384,
                "discovery": {
                    "mode": "endpointslices",
                    "service": "vllm-llama-8b-spot",
                    "port": "http",
                    "max_num_seqs": SLOTS,
                },
                "price": {"input_per_mtok": "0.012", "output_per_mtok": "0.024"},
            },
        )
        config.setdefault("queue", {})["deadline_admission"] = False

    return edit


def _openai(app: Any) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60)
    return openai.AsyncOpenAI(
        base_url="http://tiergate/v1", api_key="dev-acme", http_client=http, max_retries=0
    )


async def _ask(client: openai.AsyncOpenAI, text: str, max_tokens: int = 40) -> tuple[str, str]:
    """(request id, deployment that answered) of one non-streamed request to the small tier."""
    raw = await client.chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": text}], max_tokens=max_tokens
    )
    raw.parse()
    return raw.headers["x-request-id"], raw.headers["x-tiergate-model"]


def _pods(pods: dict[str, PodSim], names: str) -> dict[str, Pod]:
    return {n: Pod("127.0.0.1", pods[n].port) for n in names}


async def _rows(services: Services, ids: list[str]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for _ in range(200):
        for request_id in ids:
            if request_id not in rows and (row := await services.ledger.get(request_id)):
                rows[request_id] = row
        if len(rows) == len(ids):
            break
        await asyncio.sleep(0.05)
    return rows


@pytest.mark.slow
async def test_requests_follow_the_pool_from_one_pod_to_three_to_none(
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    kube: tuple[FakeKube, dict[str, Any]],
    pods: dict[str, PodSim],
) -> None:
    fake, api = kube
    fake.set_pods(_pods(pods, "a"))
    ids: list[str] = []
    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, time_scale=1.0, edit=_with_spot_pool(api)
    ) as (services, app, _client):
        client = _openai(app)
        # one pod: its two slots are the tier's spot capacity; every call answered
        one = await asyncio.gather(*(_ask(client, f"one {i}") for i in range(4)))
        ids += [r for r, _ in one]
        assert pods["a"].served and pods["a"].peak <= SLOTS

        # scale to three: the new pods take work as soon as they are in the slices
        fake.set_pods(_pods(pods, "abc"))
        await asyncio.sleep(0.5)
        three = await asyncio.gather(*(_ask(client, f"three {i}") for i in range(6)))
        ids += [r for r, _ in three]
        assert {d for _, d in three} == {SPOT}
        assert all(pods[n].served for n in "bc"), {n: len(pods[n].served) for n in "abc"}
        assert max(pods[n].peak for n in "abc") <= SLOTS

        # a pod told to leave (terminating) finishes the call it runs, and gets no new one
        call = asyncio.create_task(_ask(client, "a long one", max_tokens=100))
        await until(lambda: any(pods[n].now for n in "abc"), 5.0)
        busy = next(n for n in "abc" if pods[n].now)
        served = len(pods[busy].served)
        fake.set_pods({n: p for n, p in _pods(pods, "abc").items() if n != busy})
        await asyncio.sleep(0.3)
        after = await asyncio.gather(*(_ask(client, f"after {i}", max_tokens=8) for i in range(4)))
        long_id, long_by = await call
        assert long_by == SPOT and len(pods[busy].served) == served + 1
        ids += [long_id, *(r for r, _ in after)]

        # a pod killed in the middle of a call: the call is failed over, not lost
        fake.set_pods(_pods(pods, "d"))
        await asyncio.sleep(0.5)
        call = asyncio.create_task(_ask(client, "killed under me", max_tokens=100))
        await until(lambda: pods["d"].now == 1, 5.0)
        fake.set_pods({})
        await pods["d"].runner.cleanup()
        killed_id, killed_by = await call
        ids.append(killed_id)
        assert killed_by == SMALL

        # no pod at all: the on-demand pool answers at once, no wait for a slot that cannot come
        # (once the worker's pool has applied the empty pod list: it did not always have by the
        # time the killed call's failover returned)
        assert services.worker is not None
        pool = services.worker._pool
        await until(lambda: not pool.replicas(SPOT), 5.0)
        started = asyncio.get_running_loop().time()
        none = await asyncio.gather(*(_ask(client, f"none {i}", max_tokens=8) for i in range(3)))
        ids += [r for r, _ in none]
        assert {d for _, d in none} == {SMALL}
        assert asyncio.get_running_loop().time() - started < 5.0

        rows = await _rows(services, ids)
        assert len(rows) == len(ids)
        assert all(rows[r].status_code == 200 for r in ids)
        assert {rows[r].deployment for r, _ in none} == {SMALL}
