"""A gateway called in process: real services and workers (the test Redis, SQLite in the test's
folder), one simulator over HTTP, the app through httpx's ASGI transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web
from fastapi import FastAPI

from backends.sim import PROFILES, create_sim_app
from gateway.app import create_app
from gateway.services import Services, open_services
from gateway.settings import load_settings
from tests.support import free_port, gateway_config

__all__ = ["SMALL", "inprocess_gateway"]

SMALL = "llama-3.1-8b-instruct"


@contextlib.asynccontextmanager
async def inprocess_gateway(
    redis_url: str,
    key_prefix: str,
    workdir: Path,
    *,
    time_scale: float = 0.0,
    edit: Callable[[dict[str, Any]], None] = lambda config: None,
) -> AsyncIterator[tuple[Services, FastAPI, httpx.AsyncClient]]:
    """``time_scale``: the simulator's (0: answers at once, 1: at its profile's speed);
    ``edit``: changes to the config (made from deploy/config.example.yaml, the 8B only)."""
    runner = web.AppRunner(create_sim_app(PROFILES[SMALL], time_scale=time_scale))
    await runner.setup()
    sim_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", sim_port).start()
    path = gateway_config(
        workdir=workdir,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=f"sqlite+aiosqlite:///{workdir / 'ledger.db'}",
        sim_ports={SMALL: sim_port},
        port=free_port(),
        admin_port=free_port(),
    )
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config))
    try:
        async with open_services(load_settings(path), dev=True, workers=True) as services:
            app = create_app(services=services)
            app.state.services = services
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://tiergate", timeout=60
            ) as client:
                yield services, app, client
    finally:
        await runner.cleanup()
