"""``/v1/completions`` and ``/v1/responses`` through the official openai client, against real
processes: answers in each endpoint's own shape, one ledger row each matching what the client
got, and OpenAI-shaped 400s for what they cannot serve."""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest

from tests.support import Stack
from tests.support.ledger import wait_entry


def client(stack: Stack, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key(tenant), max_retries=0, timeout=30
    )


async def test_completion(stack: Stack) -> None:
    async with client(stack) as api:
        raw = await api.completions.with_raw_response.create(
            model="small", prompt="Write a haiku about spring rain.", max_tokens=24
        )
    completion = raw.parse()
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 24
    assert raw.headers["x-tiergate-tier"] == "small"
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert (entry.outcome, entry.status_code, entry.stream) == ("ok", 200, False)
    assert entry.prompt_tokens == completion.usage.prompt_tokens
    assert entry.completion_tokens == completion.usage.completion_tokens
    assert entry.cost_usd == Decimal(raw.headers["x-tiergate-cost-usd"]) > 0


async def test_completion_stream(stack: Stack) -> None:
    async with client(stack) as api:
        raw = await api.completions.with_raw_response.create(
            model="auto",
            prompt="What is the capital of France?",
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in raw.parse()]
    assert all(chunk.object == "text_completion" for chunk in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    extra = chunks[-1].model_extra or {}
    cost = Decimal(extra["x_tiergate"]["cost_usd"])
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert (entry.outcome, entry.stream) == ("ok", True)
    assert entry.completion_tokens == usage.completion_tokens
    assert entry.prompt_tokens == usage.prompt_tokens
    assert entry.cost_usd == cost > 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt.str"),
    ],
)
async def test_completion_refusals(stack: Stack, fields: dict[str, object], param: str) -> None:
    body: dict[str, object] = {"prompt": "Say hello.", **fields}
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as caught:
            await api.completions.create(model="small", **body)  # type: ignore[call-overload]
    error = caught.value
    assert error.status_code == 400 and error.code == "invalid_request"
    assert error.param is not None and error.param.startswith(param.split(".")[0])
    request_id = error.response.headers["x-request-id"]
    entry = await wait_entry(stack.database_url, request_id)
    assert (entry.status_code, entry.outcome) == (400, error.code)


async def test_response(stack: Stack) -> None:
    async with client(stack) as api:
        raw = await api.responses.with_raw_response.create(
            model="small",
            instructions="Answer in one line.",
            input=[
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
                {"role": "user", "content": [{"type": "input_text", "text": "Another one?"}]},
            ],
            max_output_tokens=32,
            store=False,
        )
    response = raw.parse()
    assert response.object == "response"
    assert response.status in {"completed", "incomplete"}
    assert response.output_text
    assert response.store is False and response.instructions == "Answer in one line."
    assert response.usage is not None and 0 < response.usage.output_tokens <= 32
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert (entry.outcome, entry.status_code, entry.stream) == ("ok", 200, False)
    assert entry.prompt_tokens == response.usage.input_tokens
    assert entry.completion_tokens == response.usage.output_tokens
    assert entry.cost_usd == Decimal(raw.headers["x-tiergate-cost-usd"]) > 0


async def test_response_stream(stack: Stack) -> None:
    async with (
        client(stack, "globex") as api,
        api.responses.stream(model="auto", input="Write a haiku about the sea.") as stream,
    ):
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in {"response.completed", "response.incomplete"}
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and final.output_text == deltas
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage is not None and final.usage.output_tokens > 0
    tiergate = (final.model_extra or {})["x_tiergate"]
    entry = await wait_entry(stack.database_url, tiergate["request_id"])
    assert (entry.outcome, entry.stream, entry.tenant) == ("ok", True, "globex")
    assert entry.prompt_tokens == final.usage.input_tokens
    assert entry.completion_tokens == final.usage.output_tokens
    assert entry.cost_usd == Decimal(tiergate["cost_usd"]) > 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "fc_1"}]}, "input.0"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"reasoning": {"effort": "low", "summary": "auto"}}, "reasoning.summary"),
        ({"reasoning": {"effort": "low"}}, "reasoning.effort"),  # "small": none reasons
    ],
)
async def test_response_refusals(stack: Stack, fields: dict[str, object], param: str) -> None:
    body: dict[str, object] = {"input": "Say hello.", **fields}
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as caught:
            await api.responses.create(model="small", **body)  # type: ignore[arg-type]
    error = caught.value
    assert error.status_code == 400 and error.param == param
    entry = await wait_entry(stack.database_url, error.response.headers["x-request-id"])
    assert entry.status_code == 400
