"""The public app over real services (Redis with a test prefix, SQLite in tmp), no workers,
driven in-process through httpx's ASGI transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from gateway.services import Services, open_services
from gateway.settings import Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "config.example.yaml"
KEYS = {
    "acme": "dev-acme",
    "globex": "dev-globex",
    "initech": "dev-initech",
    "admin": "dev-admin",
    "finance": "dev-finance",
}


def app_settings(redis_url: str, prefix: str, tmp: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "redis": {"url": redis_url, "key_prefix": prefix},
        "database": {"url": f"sqlite+aiosqlite:///{tmp / 'ledger.db'}"},
    }
    values.update(overrides)
    return load_settings(EXAMPLE, **values)


@contextlib.asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[tuple[Services, httpx.AsyncClient]]:
    async with open_services(settings, dev=True, workers=False) as services:
        app = create_app(services=services)
        app.state.services = services
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tiergate") as client:
            yield services, client


def auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}"}
