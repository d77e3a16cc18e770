"""Reasoning parameters as hints (docs/clients.md, capabilities) through the official openai
client, against real processes (simulators, ``tiergate serve``, Redis, the SQL ledger) on the
example config, where no deployment has ``reasoning``: an OpenAI model name the config aliases
(``gpt-5*`` → ``auto``) is answered without them, saying so in ``x-tiergate-dropped`` and in
explain; a tiergate model named directly is still refused."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import Stack
from tests.support.ledger import wait_entry

ASK = [{"role": "user", "content": "Hi."}]
SMALL = "llama-3.1-8b-instruct"


def client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key("acme"), max_retries=0, timeout=30
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_an_aliased_chat_request_is_answered_without_its_reasoning(
    stack: Stack, stream: bool
) -> None:
    async with client(stack) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="gpt-5", messages=ASK, reasoning_effort="low", verbosity="low", stream=stream
        )
        if stream:
            async for _ in raw.parse():
                pass
        explained = await api.post(
            "/route/explain",
            body={"model": "gpt-5", "messages": ASK, "reasoning_effort": "low"},
            cast_to=httpx.Response,
        )
    assert raw.status_code == 200
    assert raw.headers["x-tiergate-model"] == SMALL
    assert raw.headers["x-tiergate-dropped"] == "reasoning_effort, verbosity"
    plan = explained.json()
    assert plan["needs"] == [] and plan["ruled_out"] == []
    assert {"deployment": SMALL, "fields": ["reasoning_effort"]} in plan["dropped"]
    assert [d["deployment"] for d in plan["dropped"]] == plan["deployments"]
    assert "hints not sent (alias)" in plan["reason"]
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert entry.outcome == "ok" and entry.requested_model == "gpt-5"


async def test_an_aliased_responses_request_maps_and_drops_its_reasoning(stack: Stack) -> None:
    async with client(stack) as api:
        raw = await api.responses.with_raw_response.create(
            model="gpt-5",
            input="Hi.",
            reasoning={"effort": "low"},
            text={"verbosity": "low"},
        )
    response = raw.parse()
    assert raw.status_code == 200 and response.status == "completed" and response.output_text
    assert raw.headers["x-tiergate-model"] == SMALL == response.model
    assert raw.headers["x-tiergate-dropped"] == "reasoning_effort, verbosity"
    assert response.reasoning is not None and response.reasoning.effort == "low"
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert entry.outcome == "ok" and entry.endpoint == "responses"


async def test_a_reasoning_field_tiergate_cannot_honour_is_refused_by_name(stack: Stack) -> None:
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            await api.responses.create(
                model="gpt-5", input="Hi.", reasoning={"effort": "low", "summary": "auto"}
            )
    assert refused.value.code == "invalid_request"
    assert refused.value.param == "reasoning.summary"


@pytest.mark.parametrize("model", ["large", "auto"])
async def test_a_tiergate_model_named_directly_still_needs_a_reasoning_deployment(
    stack: Stack, model: str
) -> None:
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            await api.chat.completions.create(model=model, messages=ASK, reasoning_effort="low")
        with pytest.raises(openai.BadRequestError) as responses:
            await api.responses.create(model=model, input="Hi.", reasoning={"effort": "low"})
    for error in (refused.value, responses.value):
        assert error.code == "unsupported_capability"
        assert "reasoning (reasoning parameters)" in error.message
    assert refused.value.param == "reasoning_effort"
    assert responses.value.param == "reasoning.effort"


async def test_no_reasoning_asked_is_served_by_a_model_named_directly(stack: Stack) -> None:
    """``reasoning_effort: "none"`` (and Responses' ``reasoning.effort: "none"``) asks for
    nothing a deployment lacks: answered by the example's text-only deployments, which are not
    sent the field; before, a 400 ``unsupported_capability``."""
    async with client(stack) as api:
        chat = await api.chat.completions.with_raw_response.create(
            model="auto", messages=ASK, reasoning_effort="none"
        )
        responses = await api.responses.with_raw_response.create(
            model="large", input="Hi.", reasoning={"effort": "none"}
        )
    assert chat.status_code == 200 and chat.headers["x-tiergate-model"] == SMALL
    assert chat.headers["x-tiergate-dropped"] == "reasoning_effort"
    assert responses.status_code == 200 and responses.parse().status == "completed"
    assert responses.headers["x-tiergate-model"] == "llama-3.1-70b-instruct-awq"
    assert responses.headers["x-tiergate-dropped"] == "reasoning_effort"
    for raw in (chat, responses):
        entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
        assert entry.outcome == "ok" and entry.status_code == 200
