"""Run-time tenants held to their rate limits, budgets and baseline like config-file tenants,
through the real admin and public APIs of two gateway processes (built in this test's event
loop) over one Redis and one SQLite ledger, with a simulator answering.

The *worker* process runs the jobs, books the ledger and serves the admin API the changes are
made through; the *edge* process answers the clients, with no worker of its own. So every
change crosses processes the way it does in production (SQL, then the Redis version bump and
pub/sub), and each process's limiter, budget book, lane weights and executor read it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_admin_app, create_app
from gateway.services import Services, open_services
from gateway.settings import load_settings
from tests.gateway.auth.conftest import ADMIN
from tests.gateway.queue.conftest import CountingSim, start_sim
from tests.support import free_port, gateway_config
from tests.support.ledger import wait_entry

__all__ = ["start_sim"]

SMALL = "llama-3.1-8b-instruct"
LARGE = "llama-3.1-70b-instruct-awq"
FINANCE = {"authorization": "Bearer dev-finance"}


@dataclass
class TwoProcesses:
    edge: Services
    worker: Services
    public: httpx.AsyncClient
    """The edge's public API."""
    admin: httpx.AsyncClient
    """The worker process's admin API."""
    database_url: str


@pytest.fixture
async def two(
    start_sim: Callable[..., Awaitable[CountingSim]],
    tmp_path: Path,
    redis_url: str,
    key_prefix: str,
) -> AsyncIterator[TwoProcesses]:
    sim = await start_sim(32, time_scale=0.0)
    port = int(sim.url.rsplit(":", 1)[1])
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}"
    config = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=database_url,
        # the large deployment is configured (it is the default baseline) but never called here
        sim_ports={SMALL: port, LARGE: port},
        port=free_port(),
        admin_port=free_port(),
    )
    settings = load_settings(config)
    async with (
        open_services(settings, dev=True, workers=True) as worker,
        open_services(settings, dev=True, workers=False) as edge,
    ):
        await asyncio.sleep(0.1)  # first round trips of the background loops (see conftest)
        app = create_app(services=edge)
        app.state.services = edge
        async with (
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://edge", timeout=30
            ) as public,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_admin_app(worker)),
                base_url="http://admin",
            ) as admin,
        ):
            yield TwoProcesses(edge, worker, public, admin, database_url)


async def _tenant(two: TwoProcesses, name: str, **settings: Any) -> dict[str, str]:
    """Create a run-time tenant and a key for it; the key's headers once the edge knows both."""
    created = await two.admin.post(
        "/v1/admin/tenants", json={"name": name, **settings}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    key = await two.admin.post(
        "/v1/admin/keys",
        json={"principal": f"{name}-app", "roles": [f"tenant:{name}"]},
        headers=ADMIN,
    )
    assert key.status_code == 201, key.text
    headers = {"authorization": f"Bearer {key.json()['key']}"}
    await _eventually(lambda: two.public.get("/v1/models", headers=headers), 200)
    return headers


async def _eventually(
    call: Callable[[], Awaitable[httpx.Response]], status: int, within_s: float = 2.0
) -> httpx.Response:
    """``call`` until it answers ``status`` (the edge reloads within a round trip or a poll)."""
    deadline = time.monotonic() + within_s
    while True:
        response = await call()
        if response.status_code == status or time.monotonic() > deadline:
            assert response.status_code == status, response.text
            return response
        await asyncio.sleep(0.02)


def _chat(two: TwoProcesses, headers: dict[str, str]) -> Callable[[], Awaitable[httpx.Response]]:
    body = {"model": "small", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return lambda: two.public.post("/v1/chat/completions", json=body, headers=headers)


async def test_requests_per_minute_and_a_raise_without_restart(two: TwoProcesses) -> None:
    headers = await _tenant(two, "umbrella", requests_per_minute=2)
    chat = _chat(two, headers)
    for _ in range(2):
        assert (await chat()).status_code == 200
    refused = await chat()
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 30  # one request refills in 30 s

    patched = await two.admin.patch(
        "/v1/admin/tenants/umbrella", json={"requests_per_minute": 600}, headers=ADMIN
    )
    assert patched.status_code == 200 and patched.json()["requests_per_minute"] == 600
    # The edge applies it at its reload; at 600/min the bucket refills one in 0.1 s, where the
    # old limit would have made it wait 30 s.
    await _eventually(chat, 200, within_s=1.5)


async def test_a_hard_budget_refuses_and_the_reports_show_it(two: TwoProcesses) -> None:
    headers = await _tenant(
        two,
        "umbrella",
        budgets=[{"name": "tiny", "limit_usd": "0.000001"}],  # below any worst case here
        monthly_budget_usd="50",
    )
    chat = _chat(two, headers)
    refused = await chat()
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert "'tiny'" in refused.json()["error"]["message"]

    for who in (FINANCE, headers):  # finance sees every tenant's, the tenant its own
        report = await two.public.get("/v1/reports/budgets", headers=who)
        assert report.status_code == 200, report.text
        rows = {r["budget"]: r for r in report.json()["budgets"] if r["tenant"] == "umbrella"}
        assert set(rows) == {"tiny", "monthly"}
        assert (rows["tiny"]["mode"], rows["tiny"]["limit_usd"]) == ("hard", "0.000001")
        assert (rows["monthly"]["mode"], rows["monthly"]["limit_usd"]) == ("hard", "50.000000")

    raised = await two.admin.patch(
        "/v1/admin/tenants/umbrella",
        json={"budgets": [{"name": "tiny", "limit_usd": "1"}]},
        headers=ADMIN,
    )
    assert raised.status_code == 200, raised.text
    await _eventually(chat, 200)

    async def spent() -> Decimal:  # settled by the worker process, from its own copy
        report = await two.public.get("/v1/reports/budgets", headers=headers)
        rows = {r["budget"]: r for r in report.json()["budgets"]}
        return Decimal(rows["tiny"]["spent_usd"])

    deadline = time.monotonic() + 5
    while await spent() == 0:
        assert time.monotonic() < deadline, "the request was never settled against its budget"
        await asyncio.sleep(0.05)


async def test_ledger_rows_carry_the_baseline(two: TwoProcesses) -> None:
    default = await _tenant(two, "umbrella")  # the first large deployment, as for config tenants
    own = await _tenant(two, "bravo", baseline_model=SMALL)
    first = await _chat(two, default)()
    second = await _chat(two, own)()
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    umbrella = await wait_entry(two.database_url, first.headers["x-request-id"])
    bravo = await wait_entry(two.database_url, second.headers["x-request-id"])
    assert umbrella.cost_micro_usd is not None and umbrella.baseline_micro_usd is not None
    assert umbrella.baseline_micro_usd > umbrella.cost_micro_usd > 0  # large prices over small
    assert bravo.baseline_micro_usd == bravo.cost_micro_usd  # its own baseline: the small one

    report = await two.public.get("/v1/reports/costs", params={"group_by": ""}, headers=default)
    totals = report.json()["totals"]
    assert totals["unknown_baseline"] == 0 and Decimal(totals["savings_usd"]) > 0


async def test_admin_api_shows_and_checks_the_new_settings(two: TwoProcesses) -> None:
    await _tenant(two, "umbrella", weight=2, tokens_per_minute=5000)
    shown = (await two.admin.get("/v1/admin/tenants/umbrella", headers=ADMIN)).json()
    assert shown["weight"] == 2 and shown["tokens_per_minute"] == 5000
    assert shown["requests_per_minute"] is None and shown["budgets"] == []
    assert shown["baseline_model"] is None  # unset: the default deployment applies
    cases = [
        ({"baseline_model": "gpt-9"}, "baseline_model"),
        ({"budgets": [{"name": "m", "limit_usd": "-1"}]}, "budgets"),
        ({"weight": 0}, "weight"),
    ]
    for changes, param in cases:
        for response in (
            await two.admin.patch("/v1/admin/tenants/umbrella", json=changes, headers=ADMIN),
            await two.admin.post(
                "/v1/admin/tenants", json={"name": "other", **changes}, headers=ADMIN
            ),
        ):
            assert response.status_code == 400, (changes, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_request"
            assert param in f"{error['param']} {error['message']}"
    assert (await two.admin.get("/v1/admin/tenants/umbrella", headers=ADMIN)).json() == shown
