"""Tool calls, structured output, logprobs, ``n`` and model aliases through the whole stack
(simulators, ``tiergate serve``, Redis, the SQL ledger) with the official openai client, on the
small, large and external (litellm) paths."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from backends.sim.tokens import count_tokens
from tests.support import Stack
from tests.support.ledger import wait_entry

PATHS = [("small", "llama-3.1-8b-instruct"), ("large", "llama-3.1-70b-instruct-awq"),
         ("external", "gpt-4o-mini")]  # fmt: skip
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Use get_weather: is it raining in Paris?"}]


class City(BaseModel):
    name: str
    population: int
    districts: list[str]


def client(stack: Stack, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key(tenant), max_retries=0, timeout=30
    )


@pytest.mark.parametrize(("tier", "deployment"), PATHS)
async def test_tool_call_and_its_result_turn(stack: Stack, tier: str, deployment: str) -> None:
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model=tier, messages=ASK, tools=[WEATHER]
        )
        first = raw.parse()
        assert raw.headers["x-tiergate-tier"] == tier
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and call.id
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        assert first.model == deployment == raw.headers["x-tiergate-model"]
        turn = [
            *ASK,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
        ]
        second = await api.chat.completions.create(model=tier, messages=turn, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content.startswith("Result: Sunny, 21 C.")
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert entry.outcome == "ok" and entry.deployment == deployment
    assert entry.completion_tokens == first.usage.completion_tokens > 0


@pytest.mark.parametrize(("tier", "deployment"), PATHS)
async def test_streamed_tool_call(stack: Stack, tier: str, deployment: str) -> None:
    async with client(stack) as api:
        whole = await api.chat.completions.create(model=tier, messages=ASK, tools=[WEATHER])
        stream = await api.chat.completions.create(
            model=tier,
            messages=ASK,
            tools=[WEATHER],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks
             if c.choices and c.choices[0].delta.tool_calls]  # fmt: skip
    assert calls[0].id and calls[0].function.name == "get_weather"
    assert all(c.function.name is None for c in calls[1:]) and len(calls) > 2
    arguments = "".join(c.function.arguments or "" for c in calls)
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"
    assert all(c.model == deployment for c in chunks)
    last = chunks[-1]
    assert last.usage is not None and last.usage.completion_tokens == whole.usage.completion_tokens
    cost = Decimal((last.model_extra or {})["x_tiergate"]["cost_usd"])
    entry = await wait_entry(
        stack.database_url, (last.model_extra or {})["x_tiergate"]["request_id"]
    )
    assert entry.stream and entry.completion_tokens == last.usage.completion_tokens
    assert entry.cost_usd == cost


@pytest.mark.parametrize(("tier", "deployment"), PATHS)
async def test_structured_output_and_logprobs(stack: Stack, tier: str, deployment: str) -> None:
    async with client(stack) as api:
        parsed = await api.chat.completions.parse(
            model=tier,
            messages=[{"role": "user", "content": "Describe a city."}],
            response_format=City,
        )
        city = parsed.choices[0].message.parsed
        assert isinstance(city, City) and len(city.districts) == 2
        probed = await api.chat.completions.create(
            model=tier,
            messages=[{"role": "user", "content": "Say something short."}],
            logprobs=True,
            top_logprobs=2,
            max_tokens=16,
        )
    content = probed.choices[0].logprobs.content
    assert len(content) == probed.usage.completion_tokens
    assert "".join(t.token for t in content) == probed.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


@pytest.mark.parametrize(("tier", "deployment"), PATHS)
async def test_n_choices_are_all_billed(stack: Stack, tier: str, deployment: str) -> None:
    messages = [{"role": "user", "content": "Name a colour, briefly."}]
    async with client(stack, "globex") as api:
        raw = await api.chat.completions.with_raw_response.create(
            model=tier, messages=messages, n=2, max_tokens=40
        )
        single = await api.chat.completions.with_raw_response.create(
            model=tier, messages=messages, max_tokens=40
        )
    reply = raw.parse()
    texts = [c.message.content for c in reply.choices]
    assert [c.index for c in reply.choices] == [0, 1] and texts[0] != texts[1]
    assert reply.usage.completion_tokens == sum(count_tokens(t) for t in texts)
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    one = await wait_entry(stack.database_url, single.headers["x-request-id"])
    assert entry.completion_tokens == reply.usage.completion_tokens
    assert entry.completion_tokens > one.completion_tokens == single.parse().usage.completion_tokens
    assert entry.cost_usd == Decimal(raw.headers["x-tiergate-cost-usd"])
    assert entry.cost_usd is not None and one.cost_usd is not None
    assert entry.cost_usd > one.cost_usd  # the same prompt, more output: every choice is billed
    served = [json.loads(line) for line in stack.usage_logs[deployment].read_text().splitlines()]
    (logged,) = [s for s in served if s["request_id"] == raw.headers["x-request-id"]]
    assert logged["completion_tokens"] == entry.completion_tokens


@pytest.mark.parametrize(("tier", "deployment"), PATHS[:2])
async def test_streamed_n_choices(stack: Stack, tier: str, deployment: str) -> None:
    async with client(stack) as api:
        stream = await api.chat.completions.create(
            model=tier,
            messages=[{"role": "user", "content": "Two ideas for a name?"}],
            n=2,
            max_tokens=30,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = {0: "", 1: ""}
    finished: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert set(finished) == {0, 1} and texts[0] and texts[1] and texts[0] != texts[1]
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == count_tokens(texts[0]) + count_tokens(texts[1])
    request_id = (chunks[-1].model_extra or {})["x_tiergate"]["request_id"]
    entry = await wait_entry(stack.database_url, request_id)
    assert entry.completion_tokens == usage.completion_tokens and entry.deployment == deployment


async def test_streamed_n_choices_skip_litellm(stack: Stack) -> None:
    """litellm's stream wrapper ends only the first of n choices: such a stream is not planned
    on a litellm deployment, and one pinned to it is refused."""
    messages = [{"role": "user", "content": "Hi."}]
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            await api.chat.completions.create(
                model="gpt-4o-mini", messages=messages, n=2, stream=True
            )
        assert refused.value.code == "invalid_request" and "litellm" in refused.value.message
        explained = await api.post(
            "/route/explain",
            body={"model": "external", "messages": messages, "n": 2, "stream": True},
            cast_to=httpx.Response,
        )
    plan = explained.json()
    assert plan["deployments"] == ["llama-3.1-70b-instruct-awq", "llama-3.1-8b-instruct"]
    assert plan["tier"] == "large"
    assert plan["reason"].endswith("stream with n > 1: not gpt-4o-mini (litellm)")


async def test_aliases_route_and_name_what_answered(stack: Stack) -> None:
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Hello there."}]
        )
        reply = raw.parse()
        assert raw.headers["x-tiergate-tier"] == "large"
        assert reply.model == "llama-3.1-70b-instruct-awq" == raw.headers["x-tiergate-model"]
        auto = await api.chat.completions.create(
            model="gpt-5.6-luna", messages=[{"role": "user", "content": "Hi."}]
        )
        assert auto.model in {"llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"}
        ids = {m.id for m in (await api.models.list()).data}
        assert {"gpt-4o", "gpt-4.1-mini"} <= ids and "gpt-5*" not in ids
        with pytest.raises(openai.NotFoundError):
            await api.chat.completions.create(
                model="claude-3", messages=[{"role": "user", "content": "Hi."}]
            )
        response = await api.post(
            "/route/explain",
            body={"model": "gpt-4.1-nano", "messages": [{"role": "user", "content": "Hi."}]},
            cast_to=httpx.Response,
        )
    explained = response.json()
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert entry.requested_model == "gpt-4o" and entry.tier == "large"
    assert explained["alias"] == "gpt-4.1* → large" and explained["tier"] == "large"
    assert explained["requested_model"] == "gpt-4.1-nano"
    assert explained["reason"].startswith("'gpt-4.1-nano' is an alias of 'large' (gpt-4.1*)")


PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)
QUESTION = {"type": "text", "text": "What is in this picture?"}
LOOK = [{"role": "user", "content": [QUESTION, {"type": "image_url", "image_url": {"url": PIXEL}}]}]
TEXT_ONLY = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq")


def served_ids(stack: Stack, deployment: str) -> set[str]:
    lines = stack.usage_logs[deployment].read_text().splitlines()
    return {json.loads(line)["request_id"] for line in lines}


async def test_vision_request_skips_the_text_only_8b(stack: Stack) -> None:
    """Capabilities (docs/rules.md#capabilities): the example config's Llama deployments are text
    only, so an image goes to gpt-4o-mini (through litellm), never to the 8B; the image reaches
    it unchanged (its tokens are in the backend's usage), and the ledger books what it said."""
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(model="auto", messages=LOOK)
        text = await api.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": [QUESTION]}]
        )
        explained = await api.post(
            "/route/explain", body={"model": "small", "messages": LOOK}, cast_to=httpx.Response
        )
    reply = raw.parse()
    assert reply.model == "gpt-4o-mini" == raw.headers["x-tiergate-model"]
    assert raw.headers["x-tiergate-tier"] == "external"
    assert reply.usage.prompt_tokens == text.usage.prompt_tokens + 765  # the simulator's image
    request_id = raw.headers["x-request-id"]
    entry = await wait_entry(stack.database_url, request_id)
    assert entry.outcome == "ok" and entry.deployment == "gpt-4o-mini"
    assert [a.deployment for a in entry.attempts] == ["gpt-4o-mini"]
    assert entry.prompt_tokens == reply.usage.prompt_tokens
    assert entry.completion_tokens == reply.usage.completion_tokens
    assert entry.cost_usd == Decimal(raw.headers["x-tiergate-cost-usd"]) > 0
    assert all(request_id not in served_ids(stack, d) for d in TEXT_ONLY)
    plan = explained.json()
    assert plan["deployments"] == ["gpt-4o-mini"] and plan["needs"] == ["vision"]
    assert plan["ruled_out"] == [{"deployment": d, "missing": ["vision"]} for d in TEXT_ONLY]
    assert "needs vision: not llama-3.1-8b-instruct (no vision)" in plan["reason"]


@pytest.mark.parametrize(
    ("tenant", "model", "says"),
    [
        ("initech", "auto", "no deployment this request may use supports vision"),
        ("acme", "llama-3.1-8b-instruct", "'llama-3.1-8b-instruct' does not support vision"),
    ],
)
async def test_an_image_nothing_allowed_can_read_is_refused(
    stack: Stack, tenant: str, model: str, says: str
) -> None:
    """initech may use the text-only tiers alone; a request pinned to the 8B asks for it."""
    async with client(stack, tenant) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            await api.chat.completions.create(model=model, messages=LOOK)
    error = refused.value
    assert error.code == "unsupported_capability" and error.param == "messages"
    assert says in error.message
    assert error.response.headers.get("x-should-retry") == "false"
    entry = await wait_entry(stack.database_url, error.response.headers["x-request-id"])
    assert entry.outcome == "unsupported_capability" and entry.status_code == 400
    assert entry.cost_micro_usd == 0 and entry.attempts == ()


async def test_streamed_tool_call_about_an_image(stack: Stack) -> None:
    """An image and tools together, streamed: planned on the vision deployment, the tool call's
    deltas relayed as the backend sends them, the ledger row and cost as the last chunk says."""
    async with client(stack) as api:
        stream = await api.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Use get_weather for the city in this picture."},
                {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}}]}],
            tools=[WEATHER],
            stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks
             if c.choices and c.choices[0].delta.tool_calls]  # fmt: skip
    assert calls[0].id and calls[0].function.name == "get_weather" and len(calls) > 2
    arguments = json.loads("".join(c.function.arguments or "" for c in calls))
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert all(c.model == "gpt-4o-mini" for c in chunks)
    last = chunks[-1]
    extra = (last.model_extra or {})["x_tiergate"]
    entry = await wait_entry(stack.database_url, extra["request_id"])
    assert entry.stream and entry.deployment == "gpt-4o-mini" and entry.outcome == "ok"
    assert last.usage is not None and entry.prompt_tokens == last.usage.prompt_tokens
    assert entry.completion_tokens == last.usage.completion_tokens
    assert entry.cost_usd == Decimal(extra["cost_usd"]) > 0
