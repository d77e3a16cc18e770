"""The dashboard in a real headless Chromium (Debian's package): it signs in with a key, renders,
and its numbers equal the reports API's — for finance (every tenant) and for a tenant (itself).

The gateway runs in-process under uvicorn on a free port over real services (Redis with a test
prefix, SQLite in tmp); Chromium loads the page with ``--dump-dom`` and the rendered DOM is read.
"""

from __future__ import annotations

import asyncio
import html
import re
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml

from gateway.app import create_app
from gateway.services import Services
from tests.gateway.accounting.apps import EXAMPLE, app_settings, auth, running_app
from tests.gateway.accounting.factories import T0, make_entry
from tests.support import free_port

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--virtual-time-budget=15000",
    "--dump-dom",
)
ROWS = [
    make_entry("d1", tags=("chat",), cost_micro_usd=1_250_000, baseline_micro_usd=4_000_000),
    make_entry(
        "d2",
        created_at=T0 + timedelta(days=1),
        tier="large",
        deployment="llama-3.1-70b-instruct-awq",
        cost_micro_usd=2_500_000,
    ),
    make_entry(
        "d3",
        tenant="globex",
        principal="tenant:globex",
        tags=("<img src=x>",),
        cost_micro_usd=7_000_000,
        baseline_micro_usd=9_000_000,
    ),
]
DAYS = f"from={T0.date()}&to={(T0 + timedelta(days=1)).date()}"


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("the browser tests need Debian's chromium (apt-get install chromium)")


@pytest.fixture
async def served(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[str, Services, httpx.AsyncClient]]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["tenants"]["acme"]["budgets"] = [{"name": "monthly", "limit_usd": "100"}]
    settings = app_settings(redis_url, key_prefix, tmp_path, tenants=data["tenants"])
    async with running_app(settings) as (services, client):
        await services.ledger.record_many(ROWS)
        app = create_app(services=services)
        app.state.services = services
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        for _ in range(200):  # up to 10 s
            if server.started:
                break
            await asyncio.sleep(0.05)
        assert server.started
        try:
            yield f"http://127.0.0.1:{port}", services, client
        finally:
            server.should_exit = True
            await task


async def dump(url: str, tmp_path: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        chromium(),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp_path / 'chromium'}",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


def value(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*data-value="([^"]*)"', dom) or re.search(
        rf'data-value="([^"]*)"[^>]*id="{element_id}"', dom
    )
    assert match, f"#{element_id} not rendered"
    return html.unescape(match.group(1))


@pytest.mark.timeout(240)
async def test_finance_sees_every_tenant_and_numbers_match_the_api(
    served: tuple[str, Services, httpx.AsyncClient], tmp_path: Path
) -> None:
    base, _services, client = served
    dom = await dump(f"{base}/dashboard#key=dev-finance&{DAYS}", tmp_path)
    assert 'data-loaded="true"' in dom
    api = (
        await client.get(f"/v1/reports/costs?{DAYS}&group_by=day", headers=auth("finance"))
    ).json()
    totals = api["totals"]
    assert value(dom, "total-cost") == totals["cost_usd"] == "10.750000"
    assert value(dom, "total-baseline") == totals["baseline_usd"]
    assert value(dom, "total-savings") == totals["savings_usd"]
    assert value(dom, "total-requests") == str(totals["requests"])
    assert value(dom, "total-estimated") == totals["estimated_usd"]
    for tenant in ("acme", "globex"):  # the estimated share by tenant, one row each
        assert f'data-tenant="{tenant}"' in dom
    assert "all tenants" in dom
    # Spend bars per day and model add up to the API's per-day totals.
    bars = re.findall(r'<rect[^>]*data-day="([^"]+)"[^>]*data-value="([^"]+)"', dom)
    per_day: dict[str, float] = {}
    for day, amount in bars:
        per_day[day] = per_day.get(day, 0.0) + float(amount)
    assert per_day == pytest.approx({r["day"]: float(r["cost_usd"]) for r in api["rows"]})
    # A client-supplied tag is shown as text, never as markup.
    assert "<img src=x>" not in dom
    assert "&lt;img src=x&gt;" in dom
    # What-if and budgets rendered.
    assert 'data-label="as routed"' in dom
    assert "acme · monthly" in dom


@pytest.mark.timeout(240)
async def test_tenant_sees_only_itself(
    served: tuple[str, Services, httpx.AsyncClient], tmp_path: Path
) -> None:
    base, _services, client = served
    dom = await dump(f"{base}/dashboard#key=dev-acme&{DAYS}&tenant=globex", tmp_path)
    assert 'data-loaded="true"' in dom
    api = (await client.get(f"/v1/reports/costs?{DAYS}&group_by=day", headers=auth("acme"))).json()
    assert value(dom, "total-cost") == api["totals"]["cost_usd"] == "3.750000"
    assert "tenant acme" in dom
    assert "globex" not in dom.replace('value="globex"', "")


@pytest.mark.timeout(240)
async def test_a_key_that_cannot_read_reports_is_refused(
    served: tuple[str, Services, httpx.AsyncClient], tmp_path: Path
) -> None:
    base, _services, _client = served
    dom = await dump(f"{base}/dashboard#key=not-a-key", tmp_path)
    assert "This key cannot read cost reports." in dom
    assert 'data-loaded="true"' not in dom
