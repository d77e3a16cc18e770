"""``/docs`` in a real headless Chromium (Debian's package): Swagger UI renders the public API's
operations (and the admin port's), loaded only from the gateway itself — the page's content
security policy forbids every other origin, so a page that renders worked offline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from gateway.app import create_admin_app, create_app
from tests.browser.cdp import browser
from tests.gateway.accounting.apps import app_settings, running_app
from tests.support import free_port

pytestmark = pytest.mark.slow

OPERATIONS = "[...document.querySelectorAll('.opblock-summary-path')].map(e => e.textContent)"


async def _serve(app: FastAPI) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    return server, task, f"http://127.0.0.1:{port}"


async def test_swagger_ui_renders_both_apis(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with running_app(app_settings(redis_url, key_prefix, tmp_path)) as (services, _):
        public = create_app(services=services)
        public.state.services = services
        servers = [await _serve(public), await _serve(create_admin_app(services))]
        try:
            async with browser(tmp_path / "chromium") as page:
                await page.goto(f"{servers[0][2]}/docs")
                await page.wait_for(f"{OPERATIONS}.includes('/v1/embeddings')")
                paths = await page.eval(OPERATIONS)
                await page.goto(f"{servers[1][2]}/docs")
                await page.wait_for(f"{OPERATIONS}.includes('/v1/admin/tenants')")
        finally:
            for server, task, _ in servers:
                server.should_exit = True
                await task
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"} <= set(
        paths
    )
