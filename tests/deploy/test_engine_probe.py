"""The vLLM pods' liveness script (deploy/k8s/base/probes/engine_progress.py): alive while
/health answers and an engine with running requests moves its token counters; dead when the
counters stand still past the stall time with work running, or /health fails. Run against a
real simulator (vLLM's metric names) and against a /metrics page frozen mid-work."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

import aiohttp
from aiohttp import web

from backends.sim import PROFILES, create_sim_app
from tests.deploy.conftest import DEPLOY

STUCK = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 1234.0
vllm:prompt_tokens_total{model_name="m"} 999.0
"""


def _script() -> ModuleType:
    path = DEPLOY / "k8s" / "base" / "probes" / "engine_progress.py"
    spec = importlib.util.spec_from_file_location("engine_progress", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_the_verdict() -> None:
    verdict = _script().verdict
    idle = STUCK.replace("} 3.0", "} 0.0")
    assert verdict(idle, {"progress": 2233.0, "at": 0.0}, 1000.0, 120)[0]  # idle: never stuck
    alive, state = verdict(STUCK, {}, 10.0, 120)  # first look: remembered
    assert alive and state == {"progress": 2233.0, "at": 10.0}
    assert verdict(STUCK, state, 100.0, 120)[0]  # still within the stall time
    assert not verdict(STUCK, state, 131.0, 120)[0]  # work, no token for 121 s
    moved = STUCK.replace("1234.0", "1240.0")
    assert verdict(moved, state, 131.0, 120) == (True, {"progress": 2239.0, "at": 131.0})


async def test_a_serving_simulator_is_alive(tmp_path: Path) -> None:
    main = _script().main
    runner, url = await _serve(create_sim_app(PROFILES["llama-3.1-8b-instruct"], time_scale=0.0))
    args = ["--url", url, "--state", str(tmp_path / "s.json"), "--stall-s", "0.1"]
    try:
        assert await asyncio.to_thread(main, args) == 0
        async with aiohttp.ClientSession() as session:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
            await asyncio.sleep(0.2)
            assert await asyncio.to_thread(main, args) == 0  # idle after its work: alive
            async with session.post(f"{url}/admin/faults", json={"unhealthy": True}) as resp:
                assert resp.status == 200
        assert await asyncio.to_thread(main, args) == 1  # /health 503
    finally:
        await runner.cleanup()
    assert await asyncio.to_thread(main, args) == 1  # nothing listening


async def test_an_engine_frozen_with_work_is_restarted(tmp_path: Path) -> None:
    main = _script().main

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=STUCK)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner, url = await _serve(app)
    args = ["--url", url, "--state", str(tmp_path / "s.json"), "--stall-s", "0.3"]
    try:
        assert await asyncio.to_thread(main, args) == 0
        assert await asyncio.to_thread(main, args) == 0
        await asyncio.sleep(0.4)
        assert await asyncio.to_thread(main, args) == 1
    finally:
        await runner.cleanup()
