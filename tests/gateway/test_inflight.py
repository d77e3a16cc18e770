"""The per-process cap on held chat requests: one over it is refused with 503 ``overloaded`` and
``Retry-After``, booked, and its body never read; a place frees when an answer's last byte is out.

Real services and workers, a simulator over HTTP answering at its profile's speed, the ledger in
SQLite; the app called in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from aiohttp import web

from backends.sim import PROFILES, create_sim_app
from gateway.api.inflight import CountInflight, InflightRequests, Overloaded
from gateway.app import create_app
from gateway.services import Services, open_services
from gateway.settings import load_settings
from tests.support import free_port, gateway_config

SMALL = "llama-3.1-8b-instruct"
KEY = {"authorization": "Bearer dev-acme"}


def _body(max_tokens: int) -> dict[str, object]:
    return {
        "model": SMALL,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": max_tokens,
    }


@pytest.fixture
async def capped(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[Services, InflightRequests, httpx.AsyncClient]]:
    runner = web.AppRunner(create_sim_app(PROFILES[SMALL], time_scale=1.0))
    await runner.setup()
    sim_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", sim_port).start()
    path = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        sim_ports={SMALL: sim_port},
        port=free_port(),
        admin_port=free_port(),
    )
    data = yaml.safe_load(path.read_text())
    data.setdefault("limits", {})["max_inflight_requests"] = 2
    path.write_text(yaml.safe_dump(data))
    try:
        async with open_services(load_settings(path), dev=True, workers=True) as services:
            app = create_app(services=services)
            app.state.services = services
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://tiergate", timeout=60
            ) as client:
                yield services, app.state.inflight, client
    finally:
        await runner.cleanup()


async def _until(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_one_over_the_cap_is_refused_booked_then_served_once_a_place_frees(
    capped: tuple[Services, InflightRequests, httpx.AsyncClient],
) -> None:
    services, inflight, client = capped
    post = "/v1/chat/completions"
    held = [asyncio.create_task(client.post(post, json=_body(400), headers=KEY)) for _ in range(2)]
    await _until(lambda: inflight.count == 2)

    refused = await client.post(post, json=_body(8), headers=KEY)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "overloaded"
    assert refused.headers["retry-after"] == "1"
    assert not any(task.done() for task in held)  # the cap refused while both were held

    answers = await asyncio.gather(*held)
    assert [a.status_code for a in answers] == [200, 200]
    assert inflight.count == 0
    served = await client.post(post, json=_body(8), headers=KEY)
    assert served.status_code == 200, served.text

    row = None  # booked through the ledger stream and the sink: poll
    for _ in range(200):
        row = await services.ledger.get(refused.headers["x-request-id"])
        if row is not None:
            break
        await asyncio.sleep(0.05)
    assert row is not None and row.status_code == 503 and row.outcome == "overloaded"
    assert row.cost_micro_usd == 0 and not row.attempts


async def test_the_count_covers_a_response_until_its_last_byte() -> None:
    inflight = InflightRequests()
    seen: list[int] = []

    async def app(scope: object, receive: object, send: object) -> None:
        seen.append(inflight.count)
        assert callable(send)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen.append(inflight.count)
        await send({"type": "http.response.body", "body": b"x", "more_body": False})

    async def send(message: object) -> None:
        seen.append(inflight.count)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b""}

    counted = CountInflight(app, inflight=inflight)  # type: ignore[arg-type]
    await counted({"type": "http", "path": "/v1/chat/completions"}, receive, send)
    await counted({"type": "http", "path": "/v1/models"}, receive, send)
    assert seen == [1, 1, 1, 1, 0, 0, 0, 0]
    assert inflight.count == 0


def test_admit_refuses_only_over_the_limit() -> None:
    inflight = InflightRequests()
    inflight.count = 3
    inflight.admit(3)
    inflight.count = 4
    with pytest.raises(Overloaded) as refused:
        inflight.admit(3)
    assert refused.value.status == 503 and refused.value.retry_after == 1
