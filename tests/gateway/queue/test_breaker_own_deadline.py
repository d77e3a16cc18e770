"""A circuit breaker counts only failures the backend caused: calls cut short by their own
request's deadline (``x-tiergate-timeout-ms``) say nothing about the deployment, so one tenant's
short deadlines never open the breaker every tenant shares. A timeout within the tier's own
per-attempt budget still counts. Real services and workers, the 8B and 70B simulators over HTTP
at their profiles' speed, the app called in process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.faults.breaker import BreakerState
from tests.inprocess import LARGE, SMALL, inprocess_gateway

POST = "/v1/chat/completions"


def _long(model: str) -> dict[str, Any]:
    # The 70B's profile: about 35 ms a token, so 400 tokens take some 14 s.
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 400,
    }


async def test_short_deadlines_of_one_tenant_leave_the_shared_breaker_closed(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, time_scale=1.0, models=(SMALL, LARGE)
    ) as (services, _app, client):
        assert services.breaker is not None
        acme = {"authorization": "Bearer dev-acme", "x-tiergate-timeout-ms": "300"}
        cut = await asyncio.gather(*(client.post(POST, json=_long("large"), headers=acme)
                                     for _ in range(6)))  # fmt: skip
        assert [r.status_code for r in cut] == [504] * 6, [r.text for r in cut]
        assert await services.breaker.state(LARGE) is BreakerState.CLOSED

        globex = {"authorization": "Bearer dev-globex"}
        body = {**_long("large"), "max_tokens": 8}
        answered = await client.post(POST, json=body, headers=globex)
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-tiergate-model"] == LARGE
        assert await services.breaker.state(LARGE) is BreakerState.CLOSED


async def test_a_timeout_within_the_tiers_own_budget_still_counts(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    def short_attempts(config: dict[str, Any]) -> None:
        fallback = config.setdefault("fallback", {})
        fallback.setdefault("tiers", {})["large"] = {"timeouts": {"attempt_s": 0.3}}

    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, time_scale=1.0, models=(SMALL, LARGE),
        edit=short_attempts,
    ) as (services, _app, client):  # fmt: skip
        assert services.breaker is not None
        acme = {"authorization": "Bearer dev-acme"}
        await asyncio.gather(*(client.post(POST, json=_long(LARGE), headers=acme)
                               for _ in range(6)))  # fmt: skip
        assert await services.breaker.state(LARGE) is BreakerState.OPEN
