"""Fixtures for the simulator tests: a real simulator HTTP server on a free port."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from backends.sim import PROFILES, SimProfile, create_sim_app

SMALL = "llama-3.1-8b-instruct"
LARGE = "llama-3.1-70b-instruct-awq"
EXTERNAL = "gpt-4o-mini"


def profile(name: str = SMALL, **changes: Any) -> SimProfile:
    """A built-in profile, optionally with some fields changed."""
    return dataclasses.replace(PROFILES[name], **changes)


@dataclass
class RunningSim:
    base_url: str
    profile: SimProfile
    app: web.Application
    http: aiohttp.ClientSession

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0)

    async def post_chat(self, body: dict[str, Any], **headers: str) -> aiohttp.ClientResponse:
        """A raw chat request; the body is read before returning."""
        async with self.http.post(
            f"{self.base_url}/v1/chat/completions", json=body, headers=headers
        ) as resp:
            await resp.read()
            return resp

    async def set_faults(self, **faults: Any) -> None:
        async with self.http.post(f"{self.base_url}/admin/faults", json=faults) as resp:
            assert resp.status == 200, await resp.text()

    async def clear_faults(self) -> None:
        async with self.http.delete(f"{self.base_url}/admin/faults") as resp:
            assert resp.status == 200

    async def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (labels must match where given)."""
        async with self.http.get(f"{self.base_url}/metrics") as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return float(sample.value)
        raise KeyError(name)


StartSim = Callable[..., Awaitable[RunningSim]]


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    """``await start_sim(profile, time_scale=..., usage_log=...)`` -> a served simulator."""
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(prof: SimProfile | None = None, **kwargs: Any) -> RunningSim:
        prof = prof or PROFILES[SMALL]
        kwargs.setdefault("time_scale", 0.0)
        app = create_sim_app(prof, **kwargs)
        runner = web.AppRunner(app, shutdown_timeout=2.0, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        session = aiohttp.ClientSession()
        sessions.append(session)
        return RunningSim(f"http://127.0.0.1:{port}", prof, app, session)

    yield start
    for session in sessions:
        await session.close()
    for runner in runners:
        await runner.cleanup()
