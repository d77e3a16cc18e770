"""The clients applications use, pointed at tiergate with only ``base_url`` and ``api_key``
changed, asking for OpenAI model names that the config aliases (deploy/config.example.yaml):
LangChain's ``ChatOpenAI``, instructor, the OpenAI Agents SDK (its chat model and its default,
Responses model) and pydantic-ai, each through its tool-calling and structured-output paths,
against the real stack (simulators, ``tiergate
serve``, Redis, the ledger)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import instructor
import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents import OpenAIProvider as AgentsProvider
from agents.models import get_default_model
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support import Stack
from tests.support.ledger import wait_entry

pytestmark = pytest.mark.slow  # four client libraries and their own HTTP stacks: CI's slow stage

SERVED = {"llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini"}
ASK = "Use get_weather: is it raining in Paris?"


class City(BaseModel):
    name: str
    population: int
    districts: list[str]


@pytest.fixture
async def api(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key("acme"), max_retries=0, timeout=30
    ) as client:
        yield client


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """LangChain's own default client is cached across event loops (each test has its own)."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def chat_openai(stack: Stack, http: httpx.AsyncClient, model: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=f"{stack.base_url}/v1",
        api_key=stack.key("acme"),
        max_retries=0,
        http_async_client=http,
    )


@tool
def get_weather(city: str) -> str:
    """The current weather of a city."""
    return f"Drizzle over {city}"


# --- LangChain ----------------------------------------------------------------------------


async def test_langchain_tool_call_and_result_turn(stack: Stack, http: httpx.AsyncClient) -> None:
    llm = chat_openai(stack, http, "gpt-4o").bind_tools([get_weather])
    asked = await llm.ainvoke([HumanMessage(ASK)])
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    assert asked.response_metadata["finish_reason"] == "tool_calls"
    assert asked.response_metadata["model_name"] == "llama-3.1-70b-instruct-awq"  # gpt-4o → large
    result = await get_weather.ainvoke(call)
    answer = await llm.ainvoke([HumanMessage(ASK), asked, result])
    assert isinstance(answer.content, str)
    assert answer.content.startswith(f"Result: Drizzle over {call['args']['city']}.")


async def test_langchain_streamed_tool_call(stack: Stack, http: httpx.AsyncClient) -> None:
    llm = chat_openai(stack, http, "gpt-4.1-mini").bind_tools([get_weather])
    gathered: AIMessageChunk | None = None
    async for chunk in llm.astream(ASK):
        assert isinstance(chunk, AIMessageChunk)
        gathered = chunk if gathered is None else gathered + chunk
    assert gathered is not None
    (call,) = gathered.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
async def test_langchain_structured_output(
    stack: Stack, http: httpx.AsyncClient, method: str
) -> None:
    llm = chat_openai(stack, http, "gpt-4.1-nano").with_structured_output(City, method=method)
    city = await llm.ainvoke("Describe a city.")
    assert isinstance(city, City) and len(city.districts) == 2


# --- instructor ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON])
async def test_instructor(stack: Stack, api: openai.AsyncOpenAI, mode: instructor.Mode) -> None:
    client = instructor.from_openai(api, mode=mode)
    city, completion = await client.chat.completions.create_with_completion(
        model="gpt-4o",
        response_model=City,
        messages=[{"role": "user", "content": "Describe a city."}],
        max_retries=0,
    )
    assert isinstance(city, City) and city.name and len(city.districts) == 2
    assert completion.model == "llama-3.1-70b-instruct-awq"


# --- the OpenAI Agents SDK ----------------------------------------------------------------


@function_tool
def weather_tool(city: str) -> str:
    """The current weather of a city."""
    return f"Drizzle over {city}"


def sdk_agent(api: openai.AsyncOpenAI, **kw: Any) -> Agent[None]:
    # The SDK's own default model name: an alias ("gpt-5*" → auto) in the example config.
    model = OpenAIChatCompletionsModel(model=get_default_model(), openai_client=api)
    return Agent(name="weather", instructions="Answer briefly.", model=model, **kw)


async def test_agents_sdk_function_tool(stack: Stack, api: openai.AsyncOpenAI) -> None:
    agent = sdk_agent(api, tools=[weather_tool])
    result = await Runner.run(
        agent, "Use weather_tool for Paris.", run_config=RunConfig(tracing_disabled=True)
    )
    assert isinstance(result.final_output, str)
    assert result.final_output.startswith("Result: Drizzle over")
    asked, answered = result.raw_responses  # the tool call, then the answer to its result
    assert asked.request_id and answered.request_id
    entry = await wait_entry(stack.database_url, asked.request_id)
    assert entry.requested_model == get_default_model() and entry.outcome == "ok"


async def test_agents_sdk_streamed_with_structured_output(
    stack: Stack, api: openai.AsyncOpenAI
) -> None:
    agent = sdk_agent(api, tools=[weather_tool], output_type=City)
    run = Runner.run_streamed(
        agent, "Use weather_tool for Paris, then describe it.",
        run_config=RunConfig(tracing_disabled=True),
    )  # fmt: skip
    kinds = [event.type async for event in run.stream_events()]
    assert "raw_response_event" in kinds
    assert isinstance(run.final_output, City)


async def test_agents_sdk_responses_model_runs_a_function_tool(
    stack: Stack, api: openai.AsyncOpenAI
) -> None:
    """The SDK's default model class (``OpenAIResponsesModel``) on ``/v1/responses``."""
    called: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """The current weather of a city."""
        called.append(city)
        return f"Drizzle over {city}"

    model = OpenAIResponsesModel(model=get_default_model(), openai_client=api)
    agent = Agent(name="weather", instructions="Answer briefly.", model=model, tools=[weather])
    result = await Runner.run(
        agent, "Use weather for Paris.", run_config=RunConfig(tracing_disabled=True)
    )
    assert called and isinstance(result.final_output, str)
    assert result.final_output.startswith(f"Result: Drizzle over {called[0]}")
    asked, answered = result.raw_responses
    assert [item.type for item in asked.output] == ["function_call"]
    assert asked.response_id and asked.response_id.startswith("resp_")
    assert asked.request_id and answered.request_id
    entry = await wait_entry(stack.database_url, asked.request_id)
    assert entry.endpoint == "responses" and entry.outcome == "ok"
    assert entry.requested_model == get_default_model()
    assert asked.usage.output_tokens == entry.completion_tokens > 0


async def test_agents_sdk_responses_model_streams_through_a_tool(api: openai.AsyncOpenAI) -> None:
    model = OpenAIResponsesModel(model=get_default_model(), openai_client=api)
    agent = Agent(name="weather", instructions="Answer briefly.", model=model, tools=[weather_tool])
    run = Runner.run_streamed(
        agent, "Use weather_tool for Paris.", run_config=RunConfig(tracing_disabled=True)
    )
    kinds = [event.type async for event in run.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert isinstance(run.final_output, str)
    assert run.final_output.startswith("Result: Drizzle over")
    items = [item.type for item in run.new_items]
    assert items[:2] == ["tool_call_item", "tool_call_output_item"]


async def test_agents_sdk_gpt5_name_sends_reasoning_that_tiergate_drops(stack: Stack) -> None:
    """An agent built from a gpt-5 model *name* gets the SDK's gpt-5 default settings
    (``reasoning.effort``, ``text.verbosity``) on every Responses call; the name is an alias
    (``gpt-5*`` → ``auto``) and no deployment reasons, so tiergate drops them (docs/clients.md,
    capabilities) instead of refusing the run."""
    sent: list[dict[str, Any]] = []
    dropped: list[str | None] = []

    async def on_request(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    async def on_response(response: httpx.Response) -> None:
        dropped.append(response.headers.get("x-tiergate-dropped"))

    hooks: Any = {"request": [on_request], "response": [on_response]}
    async with (
        httpx.AsyncClient(timeout=30, event_hooks=hooks) as http,
        openai.AsyncOpenAI(
            base_url=f"{stack.base_url}/v1", api_key=stack.key("acme"), max_retries=0,
            http_client=http,
        ) as api,
    ):  # fmt: skip
        agent = Agent(name="weather", instructions="Answer briefly.", model="gpt-5",
                      tools=[weather_tool])  # fmt: skip
        assert agent.model_settings.reasoning is not None  # the SDK's gpt-5 defaults
        provider = AgentsProvider(openai_client=api, use_responses=True)
        result = await Runner.run(
            agent, "Use weather_tool for Paris.",
            run_config=RunConfig(model_provider=provider, tracing_disabled=True),
        )  # fmt: skip
    assert isinstance(result.final_output, str)
    assert result.final_output.startswith("Result: Drizzle over")
    assert len(sent) == 2  # the tool call, then the answer to its result
    for body in sent:
        assert body["model"] == "gpt-5" and body["reasoning"]["effort"] == "low"
        assert body["text"]["verbosity"] == "low"
    assert dropped == ["reasoning_effort, verbosity"] * 2
    asked = result.raw_responses[0]
    assert asked.request_id
    entry = await wait_entry(stack.database_url, asked.request_id)
    assert entry.endpoint == "responses" and entry.outcome == "ok"


# --- pydantic-ai --------------------------------------------------------------------------


def pydantic_model(api: openai.AsyncOpenAI, name: str) -> OpenAIChatModel:
    # The client is ours, to be closed: pydantic-ai's own would outlive the test's event loop.
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=api))


async def test_pydantic_ai_tool_and_structured_output(api: openai.AsyncOpenAI) -> None:
    agent = PydanticAgent(pydantic_model(api, "gpt-4o"), output_type=City, retries=0)
    called: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        called.append(city)
        return f"Drizzle over {city}"

    result = await agent.run("Use get_weather for Paris, then describe the city.")
    assert isinstance(result.output, City) and called
    assert result.response.model_name == "llama-3.1-70b-instruct-awq"
    request_id = result.response.provider_response_id
    assert request_id


async def test_pydantic_ai_text_agent_streams_through_a_tool(api: openai.AsyncOpenAI) -> None:
    agent = PydanticAgent(pydantic_model(api, "gpt-5-mini"), retries=0)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        return f"Drizzle over {city}"

    async with agent.run_stream(ASK) as run:
        text = await run.get_output()
    assert text.startswith("Result: Drizzle over")
    assert run.response.model_name in SERVED


async def test_a_client_request_books_one_ledger_row(stack: Stack, api: openai.AsyncOpenAI) -> None:
    """What the clients send is an ordinary request: one row, under the name the client used."""
    client = instructor.from_openai(api, mode=instructor.Mode.TOOLS)
    _, completion = await client.chat.completions.create_with_completion(
        model="gpt-4o",
        response_model=City,
        messages=[{"role": "user", "content": "Describe a city."}],
        max_retries=0,
    )
    raw = completion._request_id
    assert raw is not None
    entry = await wait_entry(stack.database_url, raw)
    assert entry.requested_model == "gpt-4o" and entry.outcome == "ok"
    assert entry.completion_tokens == completion.usage.completion_tokens
