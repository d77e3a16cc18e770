"""The public API through the official openai client, against real processes."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import openai
import pytest

from tests.support import Stack
from tests.support.ledger import wait_entry


def client(stack: Stack, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key(tenant), max_retries=0, timeout=30
    )


async def test_non_streamed_auto(stack: Stack) -> None:
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "What is the capital of France?"}]
        )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    headers = raw.headers
    assert headers["x-tiergate-tier"] in {"small", "large"}
    assert headers["x-tiergate-rule"] == "auto:threshold"
    assert headers["x-tiergate-model"] in {"llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"}
    assert Decimal(headers["x-tiergate-cost-usd"]) > 0
    assert float(headers["x-tiergate-overhead-ms"]) >= 0
    timing = dict(part.split(";dur=") for part in headers["server-timing"].split(", "))
    stages = {name: float(ms) for name, ms in timing.items()}
    expected = {"auth", "parse", "route", "limits", "queue", "backend", "worker", "relay", "total"}
    assert set(stages) == expected
    assert all(ms >= 0 for ms in stages.values())
    assert stages["backend"] > 0
    parts = sum(ms for name, ms in stages.items() if name != "total")
    assert abs(stages["total"] - parts) < 0.01  # the stages add up to the whole
    request_id = headers["x-request-id"]
    entry = await wait_entry(stack.database_url, request_id)
    assert entry.tenant == "acme"
    assert entry.outcome == "ok"
    assert entry.prompt_tokens == completion.usage.prompt_tokens
    assert entry.completion_tokens == completion.usage.completion_tokens
    assert entry.cost_usd == Decimal(headers["x-tiergate-cost-usd"])
    assert entry.deployment == headers["x-tiergate-model"]


async def test_streamed_with_usage_carries_cost(stack: Stack) -> None:
    async with client(stack, "globex") as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="small",
            messages=[{"role": "user", "content": "Write a haiku about spring rain."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        request_id = raw.headers["x-request-id"]
        assert raw.headers["x-tiergate-tier"] == "small"
        # A stream's Server-Timing covers the time to its first chunk.
        timing = dict(part.split(";dur=") for part in raw.headers["server-timing"].split(", "))
        stages = {name: float(ms) for name, ms in timing.items()}
        assert {"queue", "backend", "worker", "relay", "total"} <= set(stages)
        assert all(ms >= 0 for ms in stages.values()) and stages["backend"] > 0
        parts = sum(ms for name, ms in stages.items() if name != "total")
        assert abs(stages["total"] - parts) < 0.01
        text = []
        usage = None
        final_extra = None
        async for chunk in raw.parse():
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
                final_extra = chunk.model_extra
    assert "".join(text)
    assert usage is not None and usage.completion_tokens > 0
    assert final_extra is not None and "x_tiergate" in final_extra
    cost = Decimal(final_extra["x_tiergate"]["cost_usd"])
    assert cost > 0
    entry = await wait_entry(stack.database_url, request_id)
    assert entry.stream is True
    assert entry.completion_tokens == usage.completion_tokens
    assert entry.prompt_tokens == usage.prompt_tokens
    assert entry.cost_usd == cost
    assert entry.ttft_ms is not None and entry.ttft_ms > 0


async def test_streamed_without_usage_keeps_chunks_clean(stack: Stack) -> None:
    """A client that did not ask for usage gets no usage-only chunk; every chunk has a choice."""
    async with client(stack) as api:
        stream = await api.chat.completions.create(
            model="llama-3.1-8b-instruct",
            messages=[{"role": "user", "content": "Say hello."}],
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    assert chunks and all(chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}
    assert "x_tiergate" in (chunks[-1].model_extra or {})


@pytest.mark.parametrize(
    ("model", "tier"),
    [
        ("large", "large"),
        ("external", "external"),
        ("llama-3.1-70b-instruct-awq", "large"),
        ("gpt-4o-mini", "external"),
    ],
)
async def test_tier_and_deployment_pins(stack: Stack, model: str, tier: str) -> None:
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": "Explain photosynthesis in one line."}],
            max_tokens=32,
        )
    completion = raw.parse()
    assert raw.headers["x-tiergate-tier"] == tier
    assert completion.usage is not None and completion.usage.completion_tokens <= 32
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert entry.tier == tier
    assert entry.price_known  # external price comes from litellm's cost map
    assert entry.cost_micro_usd is not None and entry.cost_micro_usd > 0


async def test_models_lists_what_the_tenant_may_use(stack: Stack) -> None:
    async with client(stack, "initech") as api:
        models = await api.models.list()
    ids = {m.id for m in models.data}
    assert {"auto", "small", "large", "llama-3.1-8b-instruct"} <= ids
    assert "external" not in ids and "gpt-4o-mini" not in ids


async def test_usage_log_matches_ledger(stack: Stack) -> None:
    """The simulator's own usage log (independent of tiergate) agrees with the ledger row."""
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="small", messages=[{"role": "user", "content": "Count to five."}]
        )
    request_id = raw.headers["x-request-id"]
    entry = await wait_entry(stack.database_url, request_id)
    lines = stack.usage_logs["llama-3.1-8b-instruct"].read_text().splitlines()
    served = [json.loads(line) for line in lines if request_id in line]
    assert len(served) == 1
    assert served[0]["prompt_tokens"] == entry.prompt_tokens
    assert served[0]["completion_tokens"] == entry.completion_tokens


async def test_process_log_and_metrics_hold_no_keys_or_prompts(stack: Stack) -> None:
    """What the real `tiergate serve` wrote to its log and serves on /metrics after this
    module's traffic (and a refused key): no key material, no prompt text (none opted in)."""
    import asyncio

    import httpx

    from tests.support import TEST_KEYS

    secret = f"private prompt {uuid.uuid4().hex}"
    wrong_key = f"sk-wrong-{uuid.uuid4().hex}"
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="small", messages=[{"role": "user", "content": secret}]
        )
        stream = await api.chat.completions.create(
            model="small", messages=[{"role": "user", "content": secret}], stream=True
        )
        async for _chunk in stream:
            pass
    async with httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(
            f"{stack.base_url}/v1/chat/completions",
            headers={"authorization": f"Bearer {wrong_key}"},
            json={"model": "small", "messages": [{"role": "user", "content": secret}]},
        )
        assert refused.status_code == 401
        metrics = (await http.get(f"{stack.admin_url}/metrics")).text
    request_id = raw.headers["x-request-id"]
    for _ in range(100):  # the access line is written in the background
        if request_id in stack.gateway.output():
            break
        await asyncio.sleep(0.05)
    log = stack.gateway.output()
    assert request_id in log, "the capture is broken: no access line for the request"
    prompts = [
        secret,
        "What is the capital of France?",
        "Write a haiku about spring rain.",
        "Explain photosynthesis in one line.",
        "Count to five.",
    ]
    for leak in [*TEST_KEYS.values(), wrong_key, *prompts]:
        assert leak not in log, f"in the gateway's log: {leak[:20]}…"
        assert leak not in metrics, f"in the metrics: {leak[:20]}…"
