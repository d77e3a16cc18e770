"""A client that goes away mid-answer, against real processes: the gateway stops the backend
call and books one row, ``client_disconnected`` (499), with the tokens that were produced."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select

from backends.sim.answers import answer_pieces
from backends.sim.request import Message
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.schema import ledger_entries
from tests.support import (
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    new_prefix,
    start_gateway,
    start_sim,
    wait_ready,
)

SMALL = "llama-3.1-8b-instruct"


def _long_prompt() -> str:
    """A prompt whose simulated answer is long (the simulator's answers are deterministic)."""
    for n in range(1000):
        text = f"Tell me a long story, number {n}."
        if len(answer_pieces([Message("user", text)], None)) >= 250:
            return text
    raise AssertionError("no long answer found")


@pytest.fixture(scope="module")
def slow_stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("disconnect")
    sim_port, port, admin_port = free_port(), free_port(), free_port()
    sim, usage = start_sim(SMALL, sim_port, workdir, time_scale=1.0)  # ~12 ms a token
    database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
    config = gateway_config(
        workdir=workdir, redis_url=redis_url, prefix=new_prefix(),
        database_url=database_url, sim_ports={SMALL: sim_port}, port=port,
        admin_port=admin_port,
    )  # fmt: skip
    gateway: Proc | None = None
    try:
        gateway = start_gateway(config, workdir)
        wait_ready(gateway, f"http://127.0.0.1:{port}/readyz")
        yield {
            "url": f"http://127.0.0.1:{port}",
            "admin": f"http://127.0.0.1:{admin_port}",
            "db": database_url,
            "usage": usage,
        }
    finally:
        if gateway is not None:
            gateway.stop()
        sim.stop()


async def _gone_rows(database_url: str, stream: bool, timeout_s: float = 10.0) -> list[Any]:
    ledger = await SqlLedger.connect(database_url)
    query = select(ledger_entries).where(
        ledger_entries.c.outcome == "client_disconnected", ledger_entries.c.stream == stream
    )
    try:
        for _ in range(int(timeout_s / 0.1)):
            async with ledger.engine.connect() as conn:
                rows = (await conn.execute(query)).mappings().all()
            if rows:
                return list(rows)
            await asyncio.sleep(0.1)
    finally:
        await ledger.aclose()
    raise AssertionError("no client_disconnected row")


def _usage_line(path: Path, request_id: str) -> dict[str, Any]:
    for _ in range(50):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["request_id"] == request_id:
                return dict(record)
        time.sleep(0.1)
    raise AssertionError(f"the simulator logged nothing for {request_id}")


def _body(stream: bool) -> dict[str, Any]:
    return {
        "model": "small",
        "messages": [{"role": "user", "content": _long_prompt()}],
        "max_tokens": 300,
        "stream": stream,
    }


async def test_a_client_that_times_out_stops_the_call_and_is_booked_499(
    slow_stack: dict[str, Any],
) -> None:
    headers = {"Authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"}
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with session.post(
                slow_stack["url"] + "/v1/chat/completions", json=_body(False), headers=headers,
                timeout=aiohttp.ClientTimeout(total=0.8),
            ) as response:  # fmt: skip
                await response.read()
    [row] = await _gone_rows(slow_stack["db"], stream=False)
    assert row["status_code"] == 499 and row["tenant"] == "acme"
    assert [a["outcome"] for a in row["attempts"]] == ["cancelled"]
    assert row["latency_ms"] < 3000  # stopped, not run to its end (~3.5 s)
    # Booked by the worker that ran it, counted once by the edge that answered it.
    async with (
        aiohttp.ClientSession() as session,
        session.get(slow_stack["admin"] + "/metrics") as response,
    ):
        page = await response.text()
    counted = [
        line
        for line in page.splitlines()
        if line.startswith("tiergate_requests_total{")
        and 'outcome="client_disconnected"' in line
        and 'tenant="acme"' in line
    ]
    assert len(counted) == 1 and counted[0].endswith(" 1.0"), counted


async def test_a_stream_whose_client_leaves_is_aborted_and_billed_for_what_it_produced(
    slow_stack: dict[str, Any],
) -> None:
    headers = {"Authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"}
    chunks = 0
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            slow_stack["url"] + "/v1/chat/completions", json=_body(True), headers=headers
        )
        request_id = response.headers["x-request-id"]
        async for line in response.content:
            if line.startswith(b"data: {"):
                chunks += 1
            if chunks == 5:
                break
        response.close()  # the client goes away mid-stream
    [row] = await _gone_rows(slow_stack["db"], stream=True)
    assert row["request_id"] == request_id and row["status_code"] == 499
    assert 4 <= row["completion_tokens"] < 250
    sim = _usage_line(slow_stack["usage"], request_id)
    assert sim["finish_reason"] == "abort"  # the backend stopped generating
    assert row["completion_tokens"] <= sim["completion_tokens"]
