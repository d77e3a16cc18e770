"""A poison ledger event in a running gateway: set aside, shown by ``/readyz`` and the metric,
and the requests after it are still booked (the whole stack as real processes)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import redis.asyncio as aioredis

from gateway.accounting.events import encode_entry
from tests.gateway.accounting.factories import make_entry
from tests.support import Stack
from tests.support.ledger import wait_entry


async def test_a_poison_event_is_set_aside_and_booking_goes_on(
    stack: Stack, redis_url: str
) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        poison = make_entry(f"poison-{stack.prefix}", prompt_tokens=2**63)  # over BIGINT
        await redis.xadd(f"{stack.prefix}:{{ledger}}:events", {"e": encode_entry(poison)})
    finally:
        await redis.aclose()
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.key("acme"))
    reply = await client.chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": "after the poison"}]
    )
    await client.close()
    booked = await wait_entry(stack.database_url, reply.headers["x-request-id"])
    assert booked.status_code == 200
    async with httpx.AsyncClient() as http:
        deadline = time.monotonic() + 10
        ledger: dict[str, object] = {}
        while time.monotonic() < deadline:
            ledger = (await http.get(f"{stack.base_url}/readyz")).json()["ledger"]
            if ledger.get("dead_letters") == 1:
                break
            await asyncio.sleep(0.1)
        assert ledger == {"sink": "ok", "dead_letters": 1}
        metrics = (await http.get(f"{stack.admin_url}/metrics")).text
    assert 'tiergate_ledger_dead_letters_total{kind="refused"} 1.0' in metrics
