"""The prompt estimate counts what the model reads besides the messages' text: tool
definitions, tool calls and results, output schemas and images (docs/costs.md). Real request
shapes, as the openai SDK sends them."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from router.features import (
    IMAGE_TOKENS,
    IMAGE_TOKENS_LOW,
    MESSAGE_OVERHEAD_TOKENS,
    PROMPT_OVERHEAD_TOKENS,
    PromptFeatures,
    definition_tokens,
    estimate_request_tokens,
    estimate_tokens,
    message_text,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Lisbon"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TOOL_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer weather questions with the tools you have."},
    {"role": "user", "content": "What is the weather in Lisbon and in Porto?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9pw1qnYScqvGrCH58HWCvFH6",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            },
            {
                "id": "call_Xc1yB6nXJ5YdQk2xqH9H3s7L",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Porto"}'},
            },
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_9pw1qnYScqvGrCH58HWCvFH6",
        "content": '{"city": "Lisbon", "temperature": 19, "unit": "celsius", "sky": "clear"}',
    },
    {
        "role": "tool",
        "tool_call_id": "call_Xc1yB6nXJ5YdQk2xqH9H3s7L",
        "content": [{"type": "text", "text": '{"city": "Porto", "temperature": 16}'}],
    },
]
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"


def json_tokens(value: Any) -> int:
    return math.ceil(len(orjson.dumps(value)) / 4)


def test_a_body_without_definitions_adds_nothing() -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    assert definition_tokens(body) == 0
    assert estimate_request_tokens(body) == estimate_tokens(body["messages"])


def test_tool_definitions_count_as_their_json() -> None:
    body = {"messages": TOOL_CONVERSATION, "tools": [WEATHER_TOOL], "tool_choice": "auto"}
    assert definition_tokens(body) == json_tokens([WEATHER_TOOL]) > 50
    assert estimate_request_tokens(body) == estimate_tokens(TOOL_CONVERSATION) + json_tokens(
        [WEATHER_TOOL]
    )


def test_deprecated_functions_and_a_json_schema_count_too() -> None:
    schema = {
        "name": "forecast",
        "schema": {"type": "object", "properties": {"days": {"type": "integer"}}},
        "strict": True,
    }
    body = {
        "messages": [{"role": "user", "content": "Forecast?"}],
        "functions": [WEATHER_TOOL["function"]],
        "response_format": {"type": "json_schema", "json_schema": schema},
    }
    assert definition_tokens(body) == json_tokens([WEATHER_TOOL["function"]]) + json_tokens(schema)
    # a plain JSON mode adds no schema
    assert definition_tokens({"response_format": {"type": "json_object"}}) == 0


def test_tool_calls_and_tool_results_are_counted_as_text() -> None:
    call, lisbon, porto = TOOL_CONVERSATION[2:]
    assert message_text(call) == ('get_weather({"city": "Lisbon"})\nget_weather({"city": "Porto"})')
    assert message_text(lisbon) == lisbon["content"]
    assert message_text(porto) == '{"city": "Porto", "temperature": 16}'
    tokens = estimate_tokens([call])
    assert tokens == PROMPT_OVERHEAD_TOKENS + MESSAGE_OVERHEAD_TOKENS + math.ceil(
        len(message_text(call)) / 4
    )


def test_a_deprecated_function_call_is_counted_like_a_tool_call() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"city": "Faro"}'},
    }
    assert message_text(message) == 'get_weather({"city": "Faro"})'


@pytest.mark.parametrize(
    ("detail", "tokens"),
    [
        ("low", IMAGE_TOKENS_LOW),
        ("high", IMAGE_TOKENS),
        ("auto", IMAGE_TOKENS),
        (None, IMAGE_TOKENS),
    ],
)
def test_images_count_by_detail(detail: str | None, tokens: int) -> None:
    image: dict[str, Any] = {"url": PNG}
    if detail is not None:
        image["detail"] = detail
    text = {"type": "text", "text": "What is in this image?"}
    with_image = [{"role": "user", "content": [text, {"type": "image_url", "image_url": image}]}]
    without = [{"role": "user", "content": [text]}]
    assert estimate_tokens(with_image) - estimate_tokens(without) == tokens


def test_the_image_figures_follow_openais_tile_rule() -> None:
    assert IMAGE_TOKENS_LOW == 85
    # a 2048 x 768 image at its largest after scaling: 2 x 4 tiles of 512 px
    assert IMAGE_TOKENS == 85 + 170 * math.ceil(768 / 512) * math.ceil(2048 / 512) == 1445


def test_several_images_and_parts_without_a_type() -> None:
    content = [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"no": "type"},
        "plain string part",
    ]
    expected = (
        PROMPT_OVERHEAD_TOKENS
        + MESSAGE_OVERHEAD_TOKENS
        + math.ceil(len("plain string part") / 4)
        + IMAGE_TOKENS_LOW
        + IMAGE_TOKENS
    )
    assert estimate_tokens([{"role": "user", "content": content}]) == expected


def test_the_edge_and_the_worker_agree() -> None:
    """What the edge reserves budgets for and charges rate limits with is what a worker books
    when a hosted call reports no usage."""
    body = {
        "messages": [
            *TOOL_CONVERSATION,
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "And this photo?"},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                ],
            },
        ],
        "tools": [WEATHER_TOOL],
    }
    features = PromptFeatures.from_messages(
        body["messages"], definition_tokens=definition_tokens(body)
    )
    assert features.estimated_prompt_tokens == estimate_request_tokens(body)
    assert (
        features.estimated_prompt_tokens
        > estimate_tokens(body["messages"])
        > (PROMPT_OVERHEAD_TOKENS + IMAGE_TOKENS_LOW)
    )
