"""A gateway called in process: real services and workers (the test Redis, SQLite in the test's
folder), simulators over HTTP (the 8B, unless told), the app through httpx's ASGI transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
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

__all__ = ["LARGE", "SMALL", "inprocess_gateway"]

SMALL = "llama-3.1-8b-instruct"
LARGE = "llama-3.1-70b-instruct-awq"


@contextlib.asynccontextmanager
async def inprocess_gateway(
    redis_url: str,
    key_prefix: str,
    workdir: Path,
    *,
    time_scale: float = 0.0,
    edit: Callable[[dict[str, Any]], None] = lambda config: None,
    models: Sequence[str] = (SMALL,),
) -> AsyncIterator[tuple[Services, FastAPI, httpx.AsyncClient]]:
    """``time_scale``: the simulators' (0: answers at once, 1: at their profiles' speed);
    ``edit``: changes to the config (made from deploy/config.example.yaml with the deployments
    of ``models`` only, each served by a simulator of its profile)."""
    runners: list[web.AppRunner] = []
    try:
        sim_ports: dict[str, int] = {}
        for model in models:
            runner = web.AppRunner(create_sim_app(PROFILES[model], time_scale=time_scale))
            runners.append(runner)
            await runner.setup()
            sim_ports[model] = free_port()
            await web.TCPSite(runner, "127.0.0.1", sim_ports[model]).start()
        path = gateway_config(
            workdir=workdir,
            redis_url=redis_url,
            prefix=key_prefix,
            database_url=f"sqlite+aiosqlite:///{workdir / 'ledger.db'}",
            sim_ports=sim_ports,
            port=free_port(),
            admin_port=free_port(),
        )
        config = yaml.safe_load(path.read_text())
        edit(config)
        path.write_text(yaml.safe_dump(config))
        async with open_services(load_settings(path), dev=True, workers=True) as services:
            app = create_app(services=services)
            app.state.services = services
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://tiergate", timeout=60
            ) as client:
                yield services, app, client
    finally:
        for runner in runners:
            await runner.cleanup()
