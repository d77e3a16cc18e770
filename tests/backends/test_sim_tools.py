"""The simulator's tool calls, structured output, logprobs and ``n``, through the openai client:
the shapes vLLM's OpenAI-compatible server sends."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from backends.sim.tokens import count_tokens
from tests.backends.conftest import EXTERNAL, RunningSim, StartSim, profile

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ANSWER = {
    "type": "function",
    "function": {
        "name": "final_answer",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    },
}
NESTED = {
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "zip": {"type": "string", "maxLength": 5},
                "kind": {"enum": ["home", "work"]},
            },
            "required": ["street", "zip", "kind"],
        }
    },
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "exclusiveMinimum": 17, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 3},
        "home": {"$ref": "#/$defs/Address"},
        "past": {"type": "array", "items": {"$ref": "#/$defs/Address"}},
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "born": {"type": "string", "format": "date"},
    },
    "required": ["name", "age", "score", "active", "tags", "home", "past", "nickname", "born"],
    "additionalProperties": False,
}
ASK_WEATHER = [{"role": "user", "content": "Use get_weather: is it raining in Paris?"}]


async def _create(sim: RunningSim, messages: list[dict[str, Any]], **kw: Any) -> Any:
    async with sim.client() as client:
        return await client.chat.completions.create(model=sim.profile.name, messages=messages, **kw)


async def _chunks(sim: RunningSim, messages: list[dict[str, Any]], **kw: Any) -> list[Any]:
    async with sim.client() as client:
        stream = await client.chat.completions.create(
            model=sim.profile.name, messages=messages, stream=True, **kw
        )
        return [chunk async for chunk in stream]


def _schema_of(tool: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = tool["function"]["parameters"]
    return schema


@pytest.mark.parametrize("choice", ["required", "named", "auto"])
async def test_tool_call_fits_the_parameters(start_sim: StartSim, choice: str) -> None:
    sim = await start_sim()
    tool_choice: Any = choice
    if choice == "named":
        tool_choice = {"type": "function", "function": {"name": "get_weather"}}
    reply = await _create(sim, ASK_WEATHER, tools=[ANSWER, WEATHER], tool_choice=tool_choice)
    first = reply.choices[0]
    assert first.finish_reason == "tool_calls"
    assert first.message.content is None
    (call,) = first.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"  # the one the prompt names
    jsonschema.validate(json.loads(call.function.arguments), _schema_of(WEATHER))
    again = await _create(sim, ASK_WEATHER, tools=[ANSWER, WEATHER], tool_choice=tool_choice)
    assert again.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    assert reply.usage.completion_tokens == 1 + count_tokens(call.function.arguments)


async def test_auto_answers_in_text_unless_a_tool_is_named(start_sim: StartSim) -> None:
    sim = await start_sim()
    plain = [{"role": "user", "content": "Tell me something about rivers."}]
    reply = await _create(sim, plain, tools=[WEATHER])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    spaced = [{"role": "user", "content": "Please GET WEATHER for Rome."}]
    reply = await _create(sim, spaced, tools=[WEATHER])
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    none = await _create(sim, ASK_WEATHER, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.content and none.choices[0].finish_reason == "stop"


async def test_tool_result_turn_is_answered_in_text(start_sim: StartSim) -> None:
    sim = await start_sim()
    first = await _create(sim, ASK_WEATHER, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    turn = [
        *ASK_WEATHER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Light rain, 14 C"},
    ]
    reply = await _create(sim, turn, tools=[WEATHER])
    assert reply.choices[0].finish_reason == "stop"
    text = reply.choices[0].message.content
    assert text.startswith("Result: Light rain, 14 C.")
    assert count_tokens(text) == reply.usage.completion_tokens
    assert reply.usage.prompt_tokens > first.usage.prompt_tokens
    # required: the tool not called yet since the user spoke
    forced = await _create(sim, turn, tools=[WEATHER, ANSWER], tool_choice="required")
    assert forced.choices[0].message.tool_calls[0].function.name == "final_answer"


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", EXTERNAL])
async def test_streamed_tool_call_deltas(start_sim: StartSim, name: str) -> None:
    sim = await start_sim(profile(name))
    whole = await _create(sim, ASK_WEATHER, tools=[WEATHER])
    chunks = await _chunks(
        sim, ASK_WEATHER, tools=[WEATHER], stream_options={"include_usage": True}
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    head, rest = calls[0], calls[1:]
    assert head.index == 0 and head.id and head.type == "function"
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert rest and all(c.id is None and c.function.name is None for c in rest)
    arguments = "".join(c.function.arguments for c in rest)
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_json_schema_output_fits_the_schema(start_sim: StartSim) -> None:
    sim = await start_sim()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": NESTED}}
    messages = [{"role": "user", "content": "Describe a person."}]
    reply = await _create(sim, messages, response_format=fmt)
    text = reply.choices[0].message.content
    value = json.loads(text)
    jsonschema.validate(value, NESTED)
    assert len(value["tags"]) >= 3 and value["past"]
    assert count_tokens(text) == reply.usage.completion_tokens
    streamed = await _chunks(sim, messages, response_format=fmt)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text


async def test_json_object_follows_a_schema_in_the_prompt(start_sim: StartSim) -> None:
    sim = await start_sim()
    schema = _schema_of(WEATHER)
    prompted = [
        {"role": "system", "content": f"Answer in JSON matching this schema: {json.dumps(schema)}"},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    reply = await _create(sim, prompted, response_format={"type": "json_object"})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    bare = await _create(
        sim, [{"role": "user", "content": "Hi"}], response_format={"type": "json_object"}
    )
    assert set(json.loads(bare.choices[0].message.content)) == {"answer"}


async def test_logprobs(start_sim: StartSim) -> None:
    sim = await start_sim()
    messages = [{"role": "user", "content": "Say something."}]
    reply = await _create(sim, messages, logprobs=True, top_logprobs=3, max_tokens=12)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for token in content:
        assert token.logprob <= 0 and bytes(token.bytes).decode() == token.token
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token
        probs = [t.logprob for t in token.top_logprobs]
        assert probs == sorted(probs, reverse=True)
    bare = await _create(sim, messages, logprobs=True, max_tokens=12)
    assert all(t.top_logprobs == [] for t in bare.choices[0].logprobs.content)
    plain = await _create(sim, messages, max_tokens=12)
    assert plain.choices[0].logprobs is None
    chunks = await _chunks(sim, messages, logprobs=True, top_logprobs=2, max_tokens=12)
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in
                c.choices[0].logprobs.content]  # fmt: skip
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    with pytest.raises(openai.BadRequestError):
        await _create(sim, messages, top_logprobs=2)
    with pytest.raises(openai.BadRequestError):
        await _create(sim, messages, logprobs=True, top_logprobs=21)


async def test_n_choices_and_their_usage(start_sim: StartSim) -> None:
    sim = await start_sim()
    messages = [{"role": "user", "content": "Name a colour."}]
    single = await _create(sim, messages)
    reply = await _create(sim, messages, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert texts[0] == single.choices[0].message.content  # choice 0 is the n=1 answer
    assert len(set(texts)) == 3
    assert reply.usage.completion_tokens == sum(count_tokens(t) for t in texts)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens
    chunks = await _chunks(sim, messages, n=3, stream_options={"include_usage": True})
    by_index: dict[int, list[str]] = {0: [], 1: [], 2: []}
    finished: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            by_index[choice.index].append(choice.delta.content or "")
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert ["".join(by_index[i]) for i in range(3)] == texts
    assert finished == {0: "stop", 1: "stop", 2: "stop"}
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


async def test_bad_tool_requests_are_refused_like_vllm(start_sim: StartSim) -> None:
    sim = await start_sim()
    named = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError, match="has not been passed"):
        await _create(sim, ASK_WEATHER, tools=[WEATHER], tool_choice=named)
    with pytest.raises(openai.BadRequestError):
        await _create(sim, ASK_WEATHER, tool_choice="required")
    with pytest.raises(openai.BadRequestError):
        await _create(sim, ASK_WEATHER, response_format={"type": "json_schema"})
