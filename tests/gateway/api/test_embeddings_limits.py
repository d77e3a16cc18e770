"""Embeddings under a tenant's limits, in process (the real services, Redis, SQLite and the
embedding simulator over HTTP; the official client through the app's ASGI transport): a hard
budget reserves the inputs' worst case and refuses what it cannot cover, the rate limit counts
embeddings requests, and every refusal is the request's one ledger row, booked as embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.inprocess import SMALL, inprocess_gateway
from tests.support.ledger import wait_entry

EMBEDDING = "bge-m3"


def _limits(config: dict[str, Any]) -> None:
    acme = config["tenants"]["acme"]
    acme["budgets"] = [{"name": "tiny", "limit_usd": "0.00001", "window": "month", "mode": "hard"}]
    config["tenants"]["globex"]["requests_per_minute"] = 2


async def test_budget_and_rate_limit(redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, edit=_limits, models=(SMALL, EMBEDDING)
    ) as (services, _app, client):

        def api(key: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(
                base_url="http://tiergate/v1", api_key=key, http_client=client, max_retries=0
            )

        database = services.settings.database.url
        small = await api("dev-acme").embeddings.create(model=EMBEDDING, input="a few words")
        assert small.usage.prompt_tokens > 0  # well within $0.00001 at $0.01 per Mtok
        with pytest.raises(openai.RateLimitError) as over_budget:  # 1,000 inputs' worst case
            await api("dev-acme").embeddings.create(model=EMBEDDING, input=["word " * 200] * 1000)
        assert over_budget.value.code == "budget_exceeded"
        row = await wait_entry(database, over_budget.value.response.headers["x-request-id"])
        assert (row.endpoint, row.status_code, row.outcome) == (
            "embeddings",
            429,
            "budget_exceeded",
        )
        for _ in range(2):
            await api("dev-globex").embeddings.create(model="auto", input="hello")
        with pytest.raises(openai.RateLimitError) as too_fast:
            await api("dev-globex").embeddings.create(model="auto", input="hello")
        assert too_fast.value.code == "rate_limit_exceeded"
        row = await wait_entry(database, too_fast.value.response.headers["x-request-id"])
        assert (row.endpoint, row.status_code) == ("embeddings", 429)
