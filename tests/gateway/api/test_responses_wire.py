"""The Responses API's wire over chat answers: function tools and tool turns as chat's tools
and messages; tool calls as ``function_call`` items, streamed as the events the openai SDK
accumulates; a stream that breaks ends with ``response.failed`` and an ``error`` event the SDK
raises on, never a clean end."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.api.responses_wire import ResponsesShape, admit_response
from gateway.errors import InvalidRequest
from gateway.settings import LimitsSettings

CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(content: str, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    return {**CHUNK, "choices": [choice]}


def _call(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
    """A chat chunk with a piece of tool call ``index`` (named: its opening piece)."""
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if name is not None:
        call.update(id=f"call_{index}", type="function")
        call["function"]["name"] = name
    choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
    return {**CHUNK, "choices": [choice]}


def _sdk(raw: bytes) -> openai.OpenAI:
    """An openai client whose every request is answered with the SSE bytes ``raw``."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})

    return openai.OpenAI(
        base_url="http://t/v1",
        api_key="k",
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_broken_stream_fails_and_the_sdk_raises() -> None:
    stream = ResponsesShape({}).stream("req_abc")
    raw = b"".join([*stream.chunk(_chunk("Hel")), *stream.chunk(_chunk("lo"))])
    closing = {**_chunk("", "error"), "x_tiergate": {"request_id": "req_abc"}}
    error = {"error": {"message": "cut", "type": "server_error", "code": "upstream_error"}}
    raw += b"".join(stream.error(closing, error))
    events = _events(raw)
    names = [name for name, _ in events]
    assert names[-2:] == ["response.failed", "error"]
    assert "response.completed" not in names
    failed = events[-2][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "upstream_error"
    assert failed["output"][0]["content"][0]["text"] == "Hello"
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))

    with (
        pytest.raises(openai.APIError, match="cut"),
        _sdk(raw).responses.stream(model="m", input="hi") as sdk_stream,
    ):
        for _ in sdk_stream:
            pass


def test_a_cut_answer_is_incomplete() -> None:
    stream = ResponsesShape({"max_output_tokens": 2}).stream("req_x")
    raw = b"".join([*stream.chunk(_chunk("Hi", "length")), *stream.end()])
    name, data = _events(raw)[-1]
    assert name == "response.incomplete"
    assert data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}


def _admit(**fields: Any) -> dict[str, Any]:
    """The chat body a Responses request with ``fields`` runs as."""
    raw = json.dumps({"model": "m", "input": "hi", **fields}).encode()
    admitted, _shape = admit_response(raw, {}, LimitsSettings())
    return admitted.body


def test_function_tools_become_chat_tools() -> None:
    body = _admit(
        tools=[TOOL, {**TOOL, "name": "g", "description": "G."}],
        tool_choice={"type": "function", "name": "g"},
        parallel_tool_calls=False,
    )
    assert body["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                          "strict": True}},
        {"type": "function", "function": {"name": "g", "description": "G.",
                                          "parameters": {"type": "object"}, "strict": True}},
    ]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    assert body["parallel_tool_calls"] is False
    bare = _admit(tool_choice="auto", parallel_tool_calls=True)  # chat APIs refuse these alone
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(bare)


def test_a_tool_turn_becomes_chat_messages() -> None:
    call = {"type": "function_call", "name": "f", "id": "fc_1", "status": "completed"}
    body = _admit(
        tools=[TOOL],
        input=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {**call, "call_id": "c1", "arguments": '{"a":1}'},
            {**call, "call_id": "c2", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "dr"}, {"type": "input_text", "text": "y"}]},
            {**call, "call_id": "c3", "arguments": "{}"},
        ],
    )  # fmt: skip
    assert body["messages"] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "dry"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "computer_use_preview"}]}, "tools"),
        ({"tools": [TOOL, {"type": "custom", "name": "x"}]}, "tools"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools.0.defer_loading"),
        ({"tools": [{"type": "function"}]}, "tools.0.name"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
         "input.0.arguments"),
        ({"input": [{"type": "function_call_output", "call_id": "c",
                     "output": [{"type": "input_image", "image_url": "x"}]}]},
         "input.0.output.str"),
    ],
)  # fmt: skip
def test_what_tools_cannot_do_is_refused(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _admit(**fields)
    assert caught.value.param is not None and caught.value.param.startswith(param)


def test_an_answer_with_text_and_tool_calls() -> None:
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
        for i, n in enumerate(("f", "g"))
    ]
    message = {"role": "assistant", "content": "On it.", "tool_calls": calls}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    body = {"id": "chatcmpl-7", "created": 1, "model": "m", "choices": [choice]}
    output = ResponsesShape({}).answer(body)["output"]
    assert [(o["type"], o["id"]) for o in output] == [
        ("message", "msg_7"), ("function_call", "fc_7_0"), ("function_call", "fc_7_1")
    ]  # fmt: skip
    assert [(o["call_id"], o["name"]) for o in output[1:]] == [("call_0", "f"), ("call_1", "g")]
    only_calls = ResponsesShape({}).answer(
        {**body, "choices": [{**choice, "message": {**message, "content": None}}]}
    )
    assert [o["type"] for o in only_calls["output"]] == ["function_call", "function_call"]


def test_streamed_text_then_parallel_calls_accumulate_in_the_sdk() -> None:
    stream = ResponsesShape({}).stream("req_s")
    chunks = [
        {**CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        _chunk("Let me "),
        _chunk("check."),
        _call(0, "", name="f"),
        _call(0, '{"city": '),
        _call(0, '"Paris"}'),
        _call(1, '{"x"', name="g"),
        _call(1, ": 1}"),
        {**_chunk("", "tool_calls"), "usage": {"prompt_tokens": 5, "completion_tokens": 9}},
    ]
    raw = b"".join(part for chunk in chunks for part in stream.chunk(chunk)) + b"".join(
        stream.end()
    )
    names = [name for name, _ in _events(raw)]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 2,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", *["response.function_call_arguments.delta"] * 2,
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", *["response.function_call_arguments.delta"] * 2,
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    with _sdk(raw).responses.stream(model="m", input="hi") as sdk_stream:
        events = list(sdk_stream)
        final = sdk_stream.get_final_response()
    snapshots = [e.snapshot for e in events if e.type == "response.function_call_arguments.delta"]
    assert snapshots == ['{"city": ', '{"city": "Paris"}', '{"x"', '{"x": 1}']
    assert final.output_text == "Let me check."
    message, first, second = final.output
    assert message.type == "message" and message.id == "msg_s"
    assert first.type == "function_call" and second.type == "function_call"
    assert (first.id, first.call_id, first.name) == ("fc_s_0", "call_0", "f")
    assert json.loads(first.arguments) == {"city": "Paris"}
    assert (second.call_id, json.loads(second.arguments)) == ("call_1", {"x": 1})
    assert final.usage is not None and final.usage.output_tokens == 9


def test_a_tool_call_cut_by_the_output_limit_is_incomplete() -> None:
    stream = ResponsesShape({"max_output_tokens": 2}).stream("req_c")
    raw = b"".join([*stream.chunk(_call(0, "", name="f")), *stream.chunk(_call(0, '{"a')),
                    *stream.chunk(_chunk("", "length")), *stream.end()])  # fmt: skip
    events = _events(raw)
    name, data = events[-1]
    assert name == "response.incomplete"
    (item,) = data["response"]["output"]
    assert (item["type"], item["status"], item["arguments"]) == (
        "function_call",
        "incomplete",
        '{"a',
    )
    assert events[-2][1]["item"]["status"] == "incomplete"
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a'}}
        ],
    }
    choice = {"index": 0, "message": message, "finish_reason": "length"}
    answer = ResponsesShape({}).answer({"id": "chatcmpl-c", "model": "m", "choices": [choice]})
    assert answer["status"] == "incomplete" and answer["output"][0]["status"] == "incomplete"


def test_tool_call_pieces_without_an_index_join_the_call_they_follow() -> None:
    stream = ResponsesShape({}).stream("req_n")
    pieces = [_call(0, "", name="f"), _call(0, '{"a":'), _call(0, " 1}"), _call(0, "{}", name="g")]
    for chunk in pieces:
        del chunk["choices"][0]["delta"]["tool_calls"][0]["index"]
    raw = b"".join(part for chunk in pieces for part in stream.chunk(chunk))
    output = _events(raw + b"".join(stream.end()))[-1][1]["response"]["output"]
    assert [(o["name"], o["arguments"]) for o in output] == [("f", '{"a": 1}'), ("g", "{}")]


def test_reasoning_effort_and_verbosity_become_chat_fields() -> None:
    body = _admit(
        reasoning={"effort": "low", "summary": None},
        text={"verbosity": "low", "format": {"type": "text"}},
    )
    assert body["reasoning_effort"] == "low" and body["verbosity"] == "low"
    assert "reasoning" not in body and "text" not in body
    assert "reasoning_effort" not in _admit(reasoning={}) and "verbosity" not in _admit()


@pytest.mark.parametrize(
    ("reasoning", "param"),
    [
        ({"effort": "low", "summary": "auto"}, "reasoning.summary"),
        ({"generate_summary": "concise"}, "reasoning.generate_summary"),
        ({"effort": 3}, "reasoning.effort"),
    ],
)
def test_what_reasoning_tiergate_cannot_honour_is_refused(
    reasoning: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _admit(reasoning=reasoning)
    assert caught.value.param == param


def test_a_responses_refusal_names_the_responses_field() -> None:
    _body, shape = admit_response(b'{"model": "m", "input": "hi"}', {}, LimitsSettings())
    assert shape.param("reasoning_effort") == "reasoning.effort"
    assert shape.param("max_tokens") == "max_output_tokens"
    assert shape.param("messages.0.content") == "input"
    assert shape.param("tools") == "tools" and shape.param(None) is None
