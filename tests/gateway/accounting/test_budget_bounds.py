"""Hard budgets cannot overshoot, whatever the prompt and the pricing: the reservation is a true
upper bound (prompt bytes, output limit, the price settlement will use), raced through the real
gateway with the simulator's own token counts; refusals caused only by in-flight reservations
invite a retry, a spent budget does not."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from backends.sim.request import Message
from backends.sim.tokens import prompt_tokens
from gateway.accounting import PriceBook
from gateway.accounting.bounds import prompt_token_bound
from gateway.accounting.budgets import worst_case_micro
from gateway.accounting.prices import Price
from gateway.accounting.schema import ledger_entries
from gateway.services import Services
from gateway.settings import DeploymentSettings
from router.features import estimate_request_tokens
from tests.gateway.accounting.apps import EXAMPLE, auth
from tests.inprocess import SMALL, inprocess_gateway

CODE = "def f(x):\n    return {k: [v, v * 2] for k, v in x.items() if v % 3 == 0}\n" * 14
JSON = json.dumps([{"id": i, "tags": ["a", "b"], "v": [1, 2, 3]} for i in range(30)])
CJK = "预算不能超支。每个请求都要预留最坏情况的费用。然后按实际结算。" * 25
EMOJI = "🚀💸📈🧾✅❌🔥🙂" * 60
PROMPTS = {"code": CODE, "json": JSON, "cjk": CJK, "emoji": EMOJI}
MAX_TOKENS = 16


def body(text: str) -> dict[str, Any]:
    return {
        "model": SMALL,
        "messages": [{"role": "system", "content": "Answer."}, {"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
    }


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_the_bound_is_at_least_what_the_simulator_counts(kind: str) -> None:
    """The simulator counts every punctuation mark and emoji as a token: the ~4-characters
    estimate falls short of it for code, JSON and emoji; the byte bound never does."""
    request = body(PROMPTS[kind])
    counted = prompt_tokens([Message(m["role"], m["content"]) for m in request["messages"]])
    assert prompt_token_bound(request) >= counted, (kind, counted)


def test_the_old_estimate_falls_short_of_json() -> None:
    """Why the bound exists: the estimate plus a quarter under-counts a JSON prompt."""
    request = body(JSON)
    counted = prompt_tokens([Message(m["role"], m["content"]) for m in request["messages"]])
    assert estimate_request_tokens(request) * 1.25 + 16 < counted


def gpu_priced(config: dict[str, Any], limit_usd: str) -> None:
    fixed(config, limit_usd)
    (dep,) = config["deployments"]
    dep["gpu_hourly_usd"] = "1.20"
    dep["gpu_expected_tokens_per_s"] = 333  # about $1 per million tokens
    dep["gpu_rate_max_per_mtok"] = "5"


def fixed(config: dict[str, Any], limit_usd: str) -> None:
    config["tenants"]["acme"]["budgets"] = [{"name": "hard", "limit_usd": limit_usd}]
    config["redis"]["command_timeout_s"] = 10


async def booked_rows(services: Services, n: int) -> None:
    for _ in range(400):
        async with services.ledger.engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(ledger_entries))).scalar()
        if rows is not None and rows >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{rows} rows booked, expected {n}")


def worst_micro(pricing: str, request: dict[str, Any]) -> int:
    """One request's reservation, from the settings the gateway will run with."""
    config = yaml.safe_load(EXAMPLE.read_text())
    (dep,) = [d for d in config["deployments"] if d["model"] == SMALL]
    if pricing == "gpu":
        gpu_priced({"deployments": [dep], "tenants": {"acme": {}}, "redis": {}}, "1")
    prices = PriceBook.from_settings([DeploymentSettings.model_validate(dep)], cost_map={})
    if pricing == "gpu":
        (pool,) = prices.gpu_pools
        rate = pool.planned_per_token
        assert rate is not None
        prices = PriceBook({SMALL: Price(rate, rate)}, output_limits={SMALL: dep["max_model_len"]})
    return worst_case_micro(prices, [SMALL], prompt_token_bound(request), MAX_TOKENS)


@pytest.mark.parametrize("pricing", ["fixed", "gpu"])
@pytest.mark.parametrize("kind", sorted(PROMPTS))
async def test_fifty_hostile_prompts_racing_a_hard_budget_never_overshoot(
    redis_url: str, key_prefix: str, tmp_path: Path, pricing: str, kind: str
) -> None:
    request = body(PROMPTS[kind])
    edit = gpu_priced if pricing == "gpu" else fixed
    limit_micro = 4 * worst_micro(pricing, request)  # room for four worst cases: it bites
    limit = f"{Decimal(limit_micro).scaleb(-6)}"
    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, edit=lambda c: edit(c, limit)
    ) as (services, _, client):
        if pricing == "gpu":
            rate = services.prices.gpu_rate(SMALL)
            assert rate is not None and rate.basis == "planned"
        replies = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=request, headers=auth("acme"))
                for _ in range(50)
            )
        )
        ok = [r for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code != 200]
        assert ok and refused, [r.status_code for r in replies]
        for r in refused:
            assert r.status_code == 429, r.text
            code = r.json()["error"]["code"]
            if code == "budget_busy":
                assert r.headers["x-should-retry"] == "true"
                assert int(r.headers["retry-after"]) <= 2
            else:
                assert code == "budget_exceeded", r.text
                assert r.headers["x-should-retry"] == "false"
        # Nothing in flight any more: requests are admitted one by one until the budget is
        # truly spent, and that refusal says so.
        sent = len(replies)
        for _ in range(200):
            last = await client.post("/v1/chat/completions", json=request, headers=auth("acme"))
            sent += 1
            if last.status_code == 200:
                ok.append(last)
            elif last.json()["error"]["code"] == "budget_busy":  # the last one still settling
                await asyncio.sleep(0.05)
            else:
                break
        assert last.status_code == 429
        assert last.json()["error"]["code"] == "budget_exceeded"
        assert last.headers["x-should-retry"] == "false"
        await booked_rows(services, sent)
        booked = [await services.ledger.get(r.headers["x-request-id"]) for r in ok]
        assert all(e is not None and e.price_known and e.prompt_tokens for e in booked)
        spent = sum(e.cost_nano or 0 for e in booked if e is not None)  # nano-dollars
        print(f"{pricing} {kind}: {len(ok)} admitted, spent {spent} nUSD of {limit_micro} uUSD")
        assert 0 < spent <= limit_micro * 1000
        (status,) = await services.budgets.status("acme")
        # The budget's spend: each row rounded up to the micro-dollar, within the limit too.
        assert status.spent_micro_usd == sum(-(-(e.cost_nano or 0) // 1000) for e in booked if e)
        assert status.spent_micro_usd <= limit_micro
        assert status.reserved_micro_usd == 0
