"""Redis restarted empty under a running `tiergate serve`: rate limits and idempotency keys come
back from the SQL ledger instead of starting afresh."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.accounting.ledger import SqlLedger
from tests.support import TEST_KEYS, RedisServer, stack_with_own_redis
from tests.support.ledger import wait_entry

SMALL = "llama-3.1-8b-instruct"
BODY = {"model": "small", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
ACME = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"}
GLOBEX = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_GLOBEX']}"}
RPM = 6
"""acme's requests per minute: one every 10 s refills, so the test's seconds barely count."""


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[tuple[RedisServer, str, str]]:
    def limit_acme(config: dict[str, Any]) -> None:
        config["tenants"]["acme"]["requests_per_minute"] = RPM

    with stack_with_own_redis(tmp_path, SMALL, edit=limit_acme) as stack:
        yield stack


def _unavailable_in_log(workdir: Path) -> str:
    """The gateway's log lines about 503s (what Redis said), for a failure's message."""
    log = (workdir / "gateway.log").read_text(errors="replace").splitlines()
    return "\n".join(line for line in log if "service_unavailable (" in line)


async def test_after_redis_restarts_empty_limits_and_keys_are_rebuilt_from_sql(
    own_stack: tuple[RedisServer, str, str], tmp_path: Path
) -> None:
    redis_server, base, database_url = own_stack
    url = f"{base}/v1/chat/completions"
    keyed = {**ACME, "idempotency-key": "order-42"}
    async with httpx.AsyncClient(timeout=10) as http:
        first = await http.post(url, json=BODY, headers=keyed)
        assert first.status_code == 200, first.text
        first_id = first.headers["x-request-id"]
        ids = [first_id]
        for _ in range(3):
            response = await http.post(url, json=BODY, headers=ACME)
            assert response.status_code == 200, response.text
            ids.append(response.headers["x-request-id"])
        for request_id in ids:  # booked through the sink before Redis goes
            await wait_entry(database_url, request_id)

        redis_server.stop()
        redis_server.start()  # empty
        deadline = time.monotonic() + 15
        while (await http.get(f"{base}/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "not ready again after Redis came back"
            await asyncio.sleep(0.2)

        repeat = await http.post(url, json=BODY, headers=keyed)
        assert repeat.status_code == 409, repeat.text
        error = repeat.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert first_id in error["message"]
        # another tenant's key of the same name is its own
        other = await http.post(url, json=BODY, headers={**GLOBEX, "idempotency-key": "order-42"})
        assert other.status_code == 200, f"{other.text}\n{_unavailable_in_log(tmp_path)}"

        # 4 before the loss + the refused repeat = 5 of acme's 6: one more, not a fresh minute
        statuses = []
        for _ in range(3):
            response = await http.post(url, json=BODY, headers=ACME)
            statuses.append(response.status_code)
        assert statuses.count(200) <= 2 and 429 in statuses, statuses

    refused = await wait_entry(database_url, repeat.headers["x-request-id"])
    assert refused.outcome == "idempotency_key_reused" and refused.status_code == 409
    assert refused.idempotency_key is None  # it did not run under the key
    ledger = await SqlLedger.connect(database_url)
    try:
        ran = await ledger.get(first_id)
        assert ran is not None and ran.idempotency_key == "order-42"
    finally:
        await ledger.aclose()
