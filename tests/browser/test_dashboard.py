"""The dashboard in a real headless Chromium (Debian's package): it signs in with a key, renders,
and its numbers equal the reports API's — for finance (every tenant) and for a tenant (itself).

The gateway runs in-process under uvicorn on a free port over real services (Redis with a test
prefix, SQLite in tmp); Chromium loads the page with ``--dump-dom`` and the rendered DOM is read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import os
import re
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml

from gateway.accounting.schema import gpu_trueup
from gateway.app import create_app
from gateway.services import Services
from tests.gateway.accounting.apps import EXAMPLE, app_settings, auth, running_app
from tests.gateway.accounting.factories import T0, make_entry
from tests.support import free_port

pytestmark = pytest.mark.slow
SHOTS = {"dir": os.environ.get("TIERGATE_DASHBOARD_SHOTS", "")}
"""Where to copy the screenshots to look at them (unset: they stay in the test's tmp folder)."""

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
    make_entry(  # a trial's request, three days later (a day with none between): $0.000042
        "d4",
        created_at=T0 + timedelta(days=3),
        app="trial",
        cost_micro_usd=0,
        cost_nano_usd=42_000,
        baseline_micro_usd=0,
        baseline_nano_usd=120_000,
    ),
]
DAYS = f"from={T0.date()}&to={(T0 + timedelta(days=3)).date()}"
TRUEUP = [  # the 8B pool's recorded cost on the first day, by token share
    ("acme", 120, 30, 1_500_000),
    ("globex", 120, 30, 1_500_000),
]


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
        async with services.ledger.engine.begin() as conn:
            await conn.execute(
                gpu_trueup.insert(),
                [
                    {
                        "day": T0.date(),
                        "deployment": "llama-3.1-8b-instruct",
                        "tenant": tenant,
                        "tokens": tokens,
                        "booked_micro_usd": booked,
                        "allocated_micro_usd": allocated,
                        "pool_paid_micro_usd": 3_000_000,
                        "paid_hours": 2.5,
                        "rolled_up_at": T0,
                    }
                    for tenant, tokens, booked, allocated in TRUEUP
                ],
            )
        assert services.budgets is not None
        now = datetime.now(UTC)
        for entry in ROWS:  # this month's budget window holds the same spend
            await services.budgets.settle(dataclasses.replace(entry, created_at=now))
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


async def screenshot(url: str, tmp_path: Path, name: str) -> Path:
    """A full-page PNG of the dashboard (1280 px wide), for the test and for people to read."""
    path = tmp_path / f"{name}.png"
    flags = [f for f in CHROMIUM_FLAGS if f != "--dump-dom"]
    proc = await asyncio.create_subprocess_exec(
        chromium(),
        *flags,
        "--hide-scrollbars",
        "--window-size=1280,3200",
        f"--screenshot={path}",
        f"--user-data-dir={tmp_path / ('chromium-' + name)}",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode == 0 and path.exists(), err.decode(errors="replace")[-2000:]
    if SHOTS.get("dir"):
        shutil.copy(path, Path(SHOTS["dir"]) / path.name)
    return path


def colored(path: Path, rgb: tuple[int, int, int]) -> int:
    """How many pixels of the screenshot are (nearly) ``rgb``."""
    from PIL import Image

    with Image.open(path) as image:
        data = image.convert("RGB").tobytes()
    r, g, b = rgb
    return sum(
        1
        for i in range(0, len(data), 3)
        if abs(data[i] - r) <= 8 and abs(data[i + 1] - g) <= 8 and abs(data[i + 2] - b) <= 8
    )


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
    assert value(dom, "total-cost") == totals["cost_usd"] == "10.750042"
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
    # The per-tenant table: cost as the API says, share of requests on large deployments.
    by_tenant = (
        await client.get(f"/v1/reports/costs?{DAYS}&group_by=tenant", headers=auth("finance"))
    ).json()
    for row in by_tenant["rows"]:
        tr = re.search(rf'<tr data-tenant-row="{row["tenant"]}"[^>]*>', dom)
        assert tr, row["tenant"]
        assert f'data-cost="{row["cost_usd"]}"' in tr.group(0)
    acme = re.search(r'<tr data-tenant-row="acme"[^>]*data-share-large="([^"]+)"', dom)
    assert acme and float(acme.group(1)) == pytest.approx(1 / 3)  # d2 of d1, d2, d4
    # The GPU true-up has its own figure: 2 x (1.50 - 0.00003).
    assert value(dom, "total-trueup") == api["gpu_trueup"]["trueup_usd"] == "2.999940"
    # Sub-cent amounts are readable: the trial app's $0.000042, not $0.00.
    assert "$0.000042 · 1" in dom
    # Dates on the axis, placed by date: the day with no request (03-03) is a gap.
    assert ">03-01<" in dom and ">03-04<" in dom
    assert 'data-day="2025-03-03"' not in dom
    # The budget bar is its spend against its own limit: acme spent $3.750042 of $100.
    ratio = re.search(r'data-label="acme · monthly"[^>]*data-ratio="([^"]+)"', dom)
    assert ratio and float(ratio.group(1)) == pytest.approx(3.750042 / 100, rel=1e-3)
    assert 'class="limit"' in dom
    shot = await screenshot(f"{base}/dashboard#key=dev-finance&{DAYS}", tmp_path, "finance")
    assert colored(shot, (0x4E, 0x79, 0xA7)) > 2000  # the spend bars and the legend are drawn
    assert colored(shot, (0x59, 0xA1, 0x4F)) > 50  # the budget's bar, against its limit


@pytest.mark.timeout(240)
async def test_a_single_day_is_drawn(
    served: tuple[str, Services, httpx.AsyncClient], tmp_path: Path
) -> None:
    base, _services, _client = served
    one = f"from={T0.date()}&to={T0.date()}"
    dom = await dump(f"{base}/dashboard#key=dev-finance&{one}", tmp_path)
    assert 'data-loaded="true"' in dom
    assert re.search(r'<circle[^>]*data-day="2025-03-01"[^>]*data-series="cost"', dom)
    assert re.search(r'<rect[^>]*data-day="2025-03-01"', dom)
    assert ">03-01<" in dom
    shot = await screenshot(f"{base}/dashboard#key=dev-finance&{one}", tmp_path, "one-day")
    assert colored(shot, (0x4E, 0x79, 0xA7)) > 2000


@pytest.mark.timeout(240)
async def test_tenant_sees_only_itself(
    served: tuple[str, Services, httpx.AsyncClient], tmp_path: Path
) -> None:
    base, _services, client = served
    dom = await dump(f"{base}/dashboard#key=dev-acme&{DAYS}&tenant=globex", tmp_path)
    assert 'data-loaded="true"' in dom
    api = (await client.get(f"/v1/reports/costs?{DAYS}&group_by=day", headers=auth("acme"))).json()
    assert value(dom, "total-cost") == api["totals"]["cost_usd"] == "3.750042"
    assert "tenant acme" in dom
    assert "globex" not in dom.replace('value="globex"', "")
    # A tenant's key has no tenant filter to show.
    assert re.search(r'<label id="tenant-label"[^>]*hidden', dom)
    shot = await screenshot(f"{base}/dashboard#key=dev-acme&{DAYS}", tmp_path, "tenant")
    assert colored(shot, (0x4E, 0x79, 0xA7)) > 1000


@pytest.mark.timeout(240)
async def test_a_key_that_cannot_read_reports_is_refused(
    served: tuple[str, Services, httpx.AsyncClient], tmp_path: Path
) -> None:
    base, _services, _client = served
    dom = await dump(f"{base}/dashboard#key=not-a-key", tmp_path)
    assert "This key cannot read cost reports." in dom
    assert 'data-loaded="true"' not in dom
