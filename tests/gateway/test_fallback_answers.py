"""What the client sees of fallback, through the official openai client and the whole gateway
in process (real services and workers, the test Redis, simulators over HTTP): a persistent 429
stays a 429 with its ``Retry-After``, a context window with nowhere to go a 400
``context_length_exceeded``, retry waits are not the gateway's overhead, a continued stream
reports the ledger's usage under one model (the continuation named in ``x_tiergate``), and a
deployment named directly falls back along its configured chain, which explain shows."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.services import Services
from tests.inprocess import LARGE, SMALL, inprocess_gateway
from tests.support.ledger import wait_entry

FAST = {
    "retry": {"max_attempts": 2, "backoff_initial_s": 0.01, "jitter_s": 0.0},
    "timeouts": {"first_token_s": 1.0, "first_byte_s": 1.0, "stall_s": 1.0, "attempt_s": 10},
}


def _config(config: dict[str, Any]) -> None:
    config["fallback"] = {"tiers": {"small": FAST, "large": FAST}}
    for dep in config["deployments"]:
        dep["fallbacks"] = [LARGE] if dep["model"] == SMALL else []
        if dep["model"] == LARGE:
            dep["max_model_len"] = 16_384  # the router thinks it fits; its server (8,192) not


@contextlib.asynccontextmanager
async def gateway(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[Services, httpx.AsyncClient, openai.AsyncOpenAI]]:
    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, models=(SMALL, LARGE), edit=_config
    ) as (services, _app, http):
        sdk = openai.AsyncOpenAI(
            base_url="http://tiergate/v1", api_key="dev-acme", http_client=http, max_retries=0
        )
        yield services, http, sdk


async def faults(services: Services, model: str, **faults: Any) -> None:
    dep = services.settings.deployment(model)
    assert dep is not None
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{dep.replicas[0].url}/admin/faults", json=faults)
        assert response.status_code == 200, response.text


MESSAGES = [{"role": "user", "content": "Explain how a circuit breaker works, in detail."}]


async def test_what_the_client_sees_of_a_failing_chain(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, key_prefix, tmp_path) as (services, _http, sdk):
        # a persistent 429 on the only deployment: 429 with the backend's Retry-After
        await faults(services, LARGE, rate_limit=True, retry_after=2)
        with pytest.raises(openai.RateLimitError) as limited:
            await sdk.chat.completions.create(model=LARGE, messages=MESSAGES, max_tokens=20)
        assert limited.value.response.headers["retry-after"] == "2"
        assert limited.value.code == "rate_limit_exceeded"
        assert "#0" not in limited.value.message
        await faults(services, LARGE)

        # a window the backend says is full, with nowhere else to go: 400, OpenAI's code
        with pytest.raises(openai.BadRequestError) as full:
            await sdk.chat.completions.create(model=LARGE, messages=MESSAGES, max_tokens=8_180)
        assert full.value.code == "context_length_exceeded"
        assert "#0" not in full.value.message


async def test_retry_waits_are_not_overhead_and_chains_are_followed(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, key_prefix, tmp_path) as (services, http, sdk):
        # the 8B named directly: its chain (the 70B) answers, after a 0.5 s Retry-After
        await faults(services, SMALL, rate_limit=True, retry_after=0.5)
        raw = await sdk.chat.completions.with_raw_response.create(
            model=SMALL, messages=MESSAGES, max_tokens=20
        )
        assert raw.headers["x-tiergate-model"] == LARGE
        assert float(raw.headers["x-tiergate-overhead-ms"]) < 400  # the 500 ms wait is not ours
        row = await wait_entry(services.settings.database.url, raw.headers["x-request-id"])
        assert [a.outcome for a in row.attempts] == ["rate_limited", "rate_limited", "ok"]

        explained = await http.post(
            "/v1/route/explain",
            json={"model": SMALL, "messages": MESSAGES},
            headers={"authorization": "Bearer dev-acme"},
        )
        body = explained.json()
        assert body["deployments"] == [SMALL, LARGE] and body["fallbacks_of"] == SMALL


async def test_a_continued_stream_is_one_answer_with_the_ledgers_usage(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, key_prefix, tmp_path) as (services, _http, sdk):
        await faults(services, SMALL, cut_after_tokens=10)
        raw = await sdk.chat.completions.with_raw_response.create(
            model=SMALL, messages=MESSAGES, max_tokens=200, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in raw.parse()]
        assert raw.headers["x-tiergate-model"] == SMALL
        assert {c.model for c in chunks} == {SMALL}  # one model, as the header says
        (usage,) = [c.usage for c in chunks if c.usage is not None]
        last = chunks[-1].model_extra or {}
        assert last["x_tiergate"]["model"] == SMALL
        assert last["x_tiergate"]["served_by"] == [SMALL, LARGE]  # the continuation, visible
        row = await wait_entry(services.settings.database.url, raw.headers["x-request-id"])
        assert [(a.deployment, a.outcome) for a in row.attempts] == [
            (SMALL, "stream_cut"),
            (LARGE, "ok"),
        ]
        assert (usage.prompt_tokens, usage.completion_tokens) == (
            row.prompt_tokens,
            row.completion_tokens,
        )
