"""A streamed request logs no ERROR: its first chunk's mark and the run's note go to Redis in one
coalescer entry of two commands, and every other entry of that pipeline (the ledger event's
``XADD``, acks, slot releases) still gets its own reply. Real services and workers, the simulator
over HTTP, the app called in process."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import warnings
from pathlib import Path

import pytest

from tests.inprocess import SMALL, inprocess_gateway

KEY = {"authorization": "Bearer dev-acme"}


async def test_streamed_requests_log_no_error_and_each_is_booked_once(
    redis_url: str, key_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "model": SMALL,
        "messages": [{"role": "user", "content": "Name three rivers."}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with caplog.at_level(logging.WARNING):
        async with inprocess_gateway(redis_url, key_prefix, tmp_path) as (services, _app, client):

            async def one() -> tuple[str, int]:
                async with client.stream(
                    "POST", "/v1/chat/completions", json=body, headers=KEY
                ) as response:
                    assert response.status_code == 200
                    lines = [line async for line in response.aiter_lines() if line]
                assert lines[-1] == "data: [DONE]"
                usage = json.loads(lines[-2].removeprefix("data: "))["usage"]
                return response.headers["x-request-id"], usage["completion_tokens"]

            streamed = await asyncio.gather(*(one() for _ in range(8)))
            for request_id, tokens in streamed:  # booked through the ledger stream and the sink
                for _ in range(100):
                    row = await services.ledger.get(request_id)
                    if row is not None:
                        break
                    await asyncio.sleep(0.05)
                assert row is not None and row.completion_tokens == tokens
            await asyncio.sleep(0.2)  # the last pipelines are out
        with warnings.catch_warnings():  # other tests' leaked files are not this test's
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()  # a failed task nobody awaited is reported when it is collected
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, "\n".join(r.getMessage() for r in errors)
