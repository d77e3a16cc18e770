"""SQL stores on both databases the gateway supports: ``store_url`` is SQLite in the test's
temporary folder, then (marker ``postgres``) a PostgreSQL database of the test's own, created on
the server ``TIERGATE_TEST_DATABASE_URL`` names and dropped afterwards. An unreachable server
fails the test; it is never skipped."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import DATABASE_URL
from tests.gateway.accounting.conftest import BACKENDS, _admin


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
        return
    name = f"tg_test_{secrets.token_hex(6)}"
    asyncio.run(_admin(DATABASE_URL, f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(DATABASE_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(DATABASE_URL, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
