"""``/dashboard`` serves a self-contained page: no external resources, a strict CSP."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.accounting.apps import app_settings, running_app


@pytest.fixture
async def client(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    settings = app_settings(redis_url, key_prefix, tmp_path)
    async with running_app(settings) as (_services, client):
        yield client


async def test_page_and_assets_are_local_only(client: httpx.AsyncClient) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert '<script src="/dashboard/session.js"' in page.text
    assert '<script src="/dashboard/app.js"' in page.text
    rules = await client.get("/dashboard/rules")
    assert '<script src="/dashboard/session.js"' in rules.text
    scripts = ("/dashboard/session.js", "/dashboard/app.js", "/dashboard/rules.js")
    for path in (*scripts, "/dashboard/app.css", "/dashboard/rules.css"):
        asset = await client.get(path)
        assert asset.status_code == 200
        assert "default-src 'none'" in asset.headers["content-security-policy"]
        urls = set(re.findall(r"https?://[^\s\"'`)]+", asset.text))
        assert urls <= {"http://www.w3.org/2000/svg"}, urls
    for path in scripts:
        assert "innerHTML" not in (await client.get(path)).text


async def test_the_page_shows_the_estimated_share_per_tenant(client: httpx.AsyncClient) -> None:
    """The page's estimated figures come from the cost report's fields (tested in
    ``test_reports_api``); the browser suite (slow) draws them."""
    page = (await client.get("/dashboard")).text
    for element in ('id="total-estimated"', 'id="table-estimated"'):
        assert element in page
    script = (await client.get("/dashboard/app.js")).text
    assert 'group_by: "tenant"' in script
    for field in ("estimated_usd", "r.estimated.", "t.estimated."):
        assert field in script
