"""Real services for the auth tests: SQLite in a temp dir, the test Redis under its own prefix."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.app import create_admin_app, create_app
from gateway.services import Services, open_services
from gateway.settings import Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "config.example.yaml"


def auth_settings(tmp_path: Path, redis_url: str, key_prefix: str) -> Settings:
    return load_settings(
        EXAMPLE,
        redis={"url": redis_url, "key_prefix": key_prefix},
        database={"url": f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}"},
        simulators=[],
    )


@pytest.fixture
def settings(tmp_path: Path, redis_url: str, key_prefix: str) -> Settings:
    return auth_settings(tmp_path, redis_url, key_prefix)


@pytest.fixture
async def services(settings: Settings) -> AsyncIterator[Services]:
    async with open_services(settings, dev=True, workers=False) as built:
        # Let the background loops make their first Redis round trips before the test (and so
        # the shutdown) starts: redis-py 8.1 can swallow a cancellation that lands inside a
        # pipeline, and a `while True` loop cancelled there never ends (seen with the queue
        # snapshot; reported, not ours to change).
        await asyncio.sleep(0.1)
        yield built


@pytest.fixture
async def admin_client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_admin_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


@pytest.fixture
async def public_client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(services=services)
    app.state.services = services  # ASGITransport runs no lifespan
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
        yield client


ADMIN = {"authorization": "Bearer dev-admin"}
