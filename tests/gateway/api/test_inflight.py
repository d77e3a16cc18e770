"""The per-process cap on held chat requests: one over it is refused with 503 ``overloaded`` and
``Retry-After``, booked, and its body never read; a place frees when an answer's last byte is out.

Real services and workers, a simulator over HTTP answering at its profile's speed, the ledger in
SQLite; the app called in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.inflight import CountInflight, InflightRequests, Overloaded
from gateway.services import Services
from tests.inprocess import SMALL, inprocess_gateway
from tests.support import until

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
    def cap(config: dict[str, Any]) -> None:
        config.setdefault("limits", {})["max_inflight_requests"] = 2

    async with inprocess_gateway(redis_url, key_prefix, tmp_path, time_scale=1.0, edit=cap) as (
        services,
        app,
        client,
    ):
        yield services, app.state.inflight, client


async def test_one_over_the_cap_is_refused_booked_then_served_once_a_place_frees(
    capped: tuple[Services, InflightRequests, httpx.AsyncClient],
) -> None:
    services, inflight, client = capped
    post = "/v1/chat/completions"
    held = [asyncio.create_task(client.post(post, json=_body(400), headers=KEY)) for _ in range(2)]
    await until(lambda: inflight.count == 2, 10)

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

    counted = CountInflight(app, inflight=inflight)
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
