"""Where the ledger sink runs: with the workers by default, alone (``tiergate sink``), or not at
all (``tiergate worker --no-sink``). Real Redis and SQLite."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from gateway.accounting import SqlLedger
from gateway.services import open_services
from tests.gateway.accounting.factories import make_entry
from tests.gateway.auth.conftest import auth_settings


async def _booked_within(ledger: SqlLedger, request_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await ledger.get(request_id) is not None:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("workers", "sink", "books"),
    [(True, None, True), (False, True, True), (True, False, False)],
    ids=["with-the-workers", "alone", "workers-without-it"],
)
async def test_the_sink_runs_where_asked(
    tmp_path: Path, redis_url: str, key_prefix: str, workers: bool, sink: bool | None, books: bool
) -> None:
    settings = auth_settings(tmp_path, redis_url, key_prefix)
    request_id = f"req-{uuid.uuid4().hex}"
    async with open_services(settings, dev=True, workers=workers, sink=sink) as services:
        await asyncio.sleep(0.1)  # the background loops' first round trips (auth conftest)
        await services.ledger_writer.write(make_entry(request_id))
        # A sink reads with a 1 s block: one that runs books the event well within 1.5 s.
        booked = await _booked_within(services.ledger, request_id, 1.5)
        left = await services.redis.xlen(services.redis_keys.ledger_events)
    assert booked is books
    assert left == (0 if books else 1)


@pytest.mark.parametrize("timeout_s", [1.0, 2.5])
async def test_request_path_redis_commands_are_bounded_by_the_setting(
    tmp_path: Path, redis_url: str, key_prefix: str, timeout_s: float
) -> None:
    settings = auth_settings(tmp_path, redis_url, key_prefix)
    redis = settings.redis.model_copy(update={"command_timeout_s": timeout_s})
    settings = settings.model_copy(update={"redis": redis})
    async with open_services(settings, dev=True, workers=False, sink=False) as services:
        pool = services.redis.connection_pool
        assert pool.connection_kwargs["socket_timeout"] == timeout_s
        assert pool.connection_kwargs["socket_connect_timeout"] == timeout_s / 2
        assert pool.timeout == timeout_s  # type: ignore[attr-defined]  # the wait for a connection
