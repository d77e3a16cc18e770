"""Function tools on ``/v1/responses`` through the official openai client, against real
processes (simulators, ``tiergate serve``, Redis, the SQL ledger): a tool call answered as a
``function_call`` item, streamed as the Responses events the SDK accumulates, its result turn
answered with text, one ledger row per request, and a 400 for tools tiergate cannot run."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseInputItemParam

from tests.e2e.conftest import Stack
from tests.support.ledger import wait_entry

PATHS = [("small", "llama-3.1-8b-instruct"), ("external", "gpt-4o-mini")]
WEATHER: Any = {
    "type": "function",
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
    "strict": True,
}
ASK = "Use get_weather: is it raining in Paris?"


def client(stack: Stack, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key(tenant), max_retries=0, timeout=30
    )


def only_call(output: list[Any]) -> ResponseFunctionToolCall:
    """The one output item, a function call with JSON arguments that fit ``WEATHER``."""
    (call,) = output
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather" and call.status == "completed"
    assert call.id is not None and call.id.startswith("fc_") and call.call_id
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in {"celsius", "fahrenheit"}
    return call


@pytest.mark.parametrize(("tier", "deployment"), PATHS)
async def test_a_tool_call_and_its_result_turn(stack: Stack, tier: str, deployment: str) -> None:
    async with client(stack) as api:
        raw = await api.responses.with_raw_response.create(
            model=tier, input=ASK, tools=[WEATHER], tool_choice="auto"
        )
        asked = raw.parse()
        call = only_call(asked.output)
        assert asked.status == "completed" and asked.model == deployment
        assert [t.name for t in asked.tools] == ["get_weather"]  # type: ignore[union-attr]
        entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
        assert asked.usage is not None
        assert (entry.outcome, entry.status_code, entry.endpoint) == ("ok", 200, "responses")
        assert entry.prompt_tokens == asked.usage.input_tokens
        assert entry.completion_tokens == asked.usage.output_tokens > 0
        assert entry.cost_usd == Decimal(raw.headers["x-tiergate-cost-usd"]) > 0

        city = json.loads(call.arguments)["city"]
        turn: list[ResponseInputItemParam] = [
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id,
             "output": f"Drizzle over {city}"},
        ]  # fmt: skip
        raw = await api.responses.with_raw_response.create(model=tier, input=turn, tools=[WEATHER])
    answered = raw.parse()
    assert [item.type for item in answered.output] == ["message"]
    assert answered.output_text.startswith(f"Result: Drizzle over {city}.")
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert answered.usage is not None and entry.outcome == "ok"
    assert entry.prompt_tokens == answered.usage.input_tokens > asked.usage.input_tokens


@pytest.mark.parametrize(("tier", "deployment"), PATHS)
async def test_a_streamed_tool_call(stack: Stack, tier: str, deployment: str) -> None:
    async with (
        client(stack, "globex") as api,
        api.responses.stream(
            model=tier, input=ASK, tools=[WEATHER], tool_choice={"type": "function",
                                                                 "name": "get_weather"}
        ) as stream,
    ):  # fmt: skip
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas > 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[2]
    assert added.type == "response.output_item.added"
    assert added.item.type == "function_call" and added.item.arguments == ""
    call = only_call(final.output)
    assert added.item.id == call.id and added.item.call_id == call.call_id
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = events[-3]
    assert done.type == "response.function_call_arguments.done"
    assert pieces == done.arguments == call.arguments
    assert final.model == deployment and final.tool_choice.type == "function"  # type: ignore[union-attr]
    tiergate = (final.model_extra or {})["x_tiergate"]
    entry = await wait_entry(stack.database_url, tiergate["request_id"])
    assert final.usage is not None
    assert (entry.outcome, entry.stream, entry.tenant) == ("ok", True, "globex")
    assert entry.completion_tokens == final.usage.output_tokens > 0
    assert entry.cost_usd == Decimal(tiergate["cost_usd"]) > 0


async def test_tool_choice_none_answers_with_text(stack: Stack) -> None:
    async with client(stack) as api:
        response = await api.responses.create(
            model="small", input=ASK, tools=[WEATHER], tool_choice="none", max_output_tokens=24
        )
    assert [item.type for item in response.output] == ["message"] and response.output_text


@pytest.mark.parametrize(
    ("tool", "kind"),
    [
        ({"type": "web_search"}, "web_search"),
        ({"type": "file_search", "vector_store_ids": ["vs_1"]}, "file_search"),
        ({"type": "mcp", "server_label": "x", "server_url": "https://example.com"}, "mcp"),
    ],
)
async def test_other_tool_types_are_refused(stack: Stack, tool: Any, kind: str) -> None:
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as caught:
            await api.responses.create(model="small", input=ASK, tools=[WEATHER, tool])
    error = caught.value
    assert error.status_code == 400 and error.param == "tools"
    assert f"'{kind}'" in error.message
    entry = await wait_entry(stack.database_url, error.response.headers["x-request-id"])
    assert (entry.status_code, entry.outcome) == (400, "invalid_request")
