"""``POST /v1/responses`` (OpenAI's Responses API), the stateless subset, on the chat path.

Nothing is stored (``store`` is answered ``false`` whatever was asked), so a request that
continues a stored response (``previous_response_id``, ``conversation``) or runs in the
background is refused with a 400 naming the field. ``instructions`` becomes a system message,
``input`` (a string, or message items whose content is text or images, and the
``function_call`` / ``function_call_output`` items of a tool turn) the messages after it,
``max_output_tokens`` the ``max_tokens``, ``text.format`` the ``response_format``,
``reasoning.effort`` the ``reasoning_effort`` and ``text.verbosity`` the ``verbosity`` (hints
when the model is named through an alias: ``router.capabilities``), function ``tools`` chat's
tools (``gateway.api.responses_tools``); the chat request is then routed,
limited, queued, billed and booked as any chat request, and its answer is turned into a
``response`` object (``ResponsesShape``; its items: ``gateway.api.responses_items``), streamed
as the Responses API's events (``gateway.api.responses_stream``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from gateway.api.admission import Admitted, admit, parse_body
from gateway.api.responses_items import output_items, response_usage
from gateway.api.responses_stream import ResponsesStream
from gateway.api.responses_tools import add_function_call, function_tools, tool_message
from gateway.api.shapes import StreamShape
from gateway.errors import InvalidRequest
from gateway.settings import LimitsSettings

__all__ = ["ResponsesRequest", "ResponsesShape", "admit_response", "responses_param"]


class ResponsesRequest(BaseModel):
    """What ``/v1/responses`` accepts; a field not listed here is refused (none is passed on)."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    input: StrictStr | Annotated[list[dict[str, Any]], Field(min_length=1)]
    instructions: StrictStr | None = None
    stream: StrictBool = False
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    user: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: StrictBool | None = None
    previous_response_id: StrictStr | None = None
    conversation: Any = None
    background: StrictBool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    truncation: StrictStr | None = None
    include: list[StrictStr] | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None


def _refuse_stateful(request: ResponsesRequest) -> None:
    if request.previous_response_id is not None:
        raise InvalidRequest(
            "previous_response_id is not supported: tiergate stores no responses (store: false);"
            " send the earlier turns in input",
            param="previous_response_id",
        )
    if request.conversation is not None:
        raise InvalidRequest(
            "conversation is not supported: tiergate stores no responses; send the turns in input",
            param="conversation",
        )
    if request.background:
        raise InvalidRequest("background responses are not supported", param="background")
    if request.include:
        raise InvalidRequest("include is not supported", param="include")


_TEXT_PARTS = ("input_text", "output_text", "text")


def _part(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    kind = part.get("type")
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image: dict[str, Any] = {"url": part["image_url"]}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise InvalidRequest(
        f"{where}: content part of type {kind!r} is not supported (text and image URLs are)",
        param=where,
    )


def _add_item(messages: list[dict[str, Any]], item: Any, i: int) -> None:
    """Add input item ``i`` to ``messages``."""
    where = f"input.{i}"
    kind = item.get("type", "message") if isinstance(item, Mapping) else None
    if kind == "message":
        messages.append(_message(item, where))
    elif kind == "function_call":
        add_function_call(messages, item, where)
    elif kind == "function_call_output":
        messages.append(tool_message(item, where))
    else:
        raise InvalidRequest(
            f"{where}: input items of type {kind!r} are not supported (messages, function_call"
            " and function_call_output are)",
            param=where,
        )


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise InvalidRequest(f"{where}.role: {role!r} is not a message role", param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list) or not content:
        raise InvalidRequest(
            f"{where}.content: a string or a list of content parts", param=f"{where}.content"
        )
    parts = [
        _part(p if isinstance(p, Mapping) else {}, f"{where}.content.{j}")
        for j, p in enumerate(content)
    ]
    if role == "assistant":  # an earlier answer: its text, as chat sends it back
        return {"role": role, "content": "".join(str(p.get("text", "")) for p in parts)}
    return {"role": role, "content": parts}


def _response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, Mapping) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(
        f"text.format type {fmt.get('type')!r} is not supported", param="text.format"
    )


def _reasoning(request: ResponsesRequest) -> dict[str, Any]:
    """``reasoning.effort`` as chat's ``reasoning_effort``, ``text.verbosity`` as its
    ``verbosity``; any other ``reasoning`` field set is refused, naming it (tiergate returns no
    reasoning items or summaries)."""
    chat: dict[str, Any] = {}
    for key, value in (request.reasoning or {}).items():
        if value is None:
            continue
        if key != "effort":
            raise InvalidRequest(
                f"reasoning.{key} is not supported (reasoning.effort is)", param=f"reasoning.{key}"
            )
        if not isinstance(value, str):
            raise InvalidRequest("reasoning.effort: a string", param="reasoning.effort")
        chat["reasoning_effort"] = value
    verbosity = (request.text or {}).get("verbosity")
    if verbosity is not None:
        if not isinstance(verbosity, str):
            raise InvalidRequest("text.verbosity: a string", param="text.verbosity")
        chat["verbosity"] = verbosity
    return chat


def _echo(request: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a ``response`` object repeats them."""
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata or {},
        "temperature": request.temperature,
        "top_p": request.top_p,
        "user": request.user,
        "text": request.text or {"format": {"type": "text"}},
        "reasoning": request.reasoning,
    }


_PARAMS = {
    "max_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
    "verbosity": "text.verbosity",
    "response_format": "text.format",
}
"""Chat fields a Responses request sets under another name."""


def responses_param(name: str | None) -> str | None:
    """The Responses field that became chat's ``name`` (an error's ``param``)."""
    if name is not None and name.startswith("messages"):
        return "input"
    return _PARAMS.get(name, name) if name is not None else None


def admit_response(
    raw: bytes, headers: dict[str, str], limits: LimitsSettings
) -> tuple[Admitted, ResponsesShape]:
    """The Responses body ``raw``, admitted as the chat request it runs as, and its shape."""
    _data, request = parse_body(raw, ResponsesRequest)
    _refuse_stateful(request)
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
    else:
        for i, item in enumerate(request.input):
            _add_item(messages, item, i)
    tools = function_tools(request.tools, request.tool_choice, request.parallel_tool_calls)
    chat: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        **tools.chat,
        **_reasoning(request),
    }
    if request.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # response.completed has the usage
    for ours, theirs in (
        ("max_tokens", request.max_output_tokens),
        ("temperature", request.temperature),
        ("top_p", request.top_p),
        ("user", request.user),
        ("metadata", request.metadata),
        ("response_format", _response_format(request.text)),
    ):
        if theirs is not None:
            chat[ours] = theirs
    try:
        admitted = admit(orjson.dumps(chat), headers, limits)
    except InvalidRequest as exc:
        exc.param = responses_param(exc.param)
        raise
    return admitted, ResponsesShape({**_echo(request), **tools.echo})


class ResponsesShape:
    """A chat answer as a ``response`` object, a stream as the Responses API's events."""

    def __init__(self, echo: Mapping[str, Any]) -> None:
        self._echo = dict(echo)

    def response(
        self,
        response_id: str,
        *,
        created_at: int,
        model: Any,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        finish_reason: Any = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        cut = finish_reason == "length"
        return {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "status": "incomplete" if cut and status == "completed" else status,
            "model": model,
            "output": output,
            "usage": usage,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "store": False,
            "previous_response_id": None,
            "truncation": "disabled",
            **self._echo,
        }

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        base = str(body.get("id", "")).removeprefix("chatcmpl-")
        choices = body.get("choices") or [{}]
        out = self.response(
            f"resp_{base}",
            created_at=int(body.get("created") or time.time()),
            model=body.get("model"),
            status="completed",
            output=output_items(
                base,
                choices[0].get("message") or {},
                cut=choices[0].get("finish_reason") == "length",
            ),
            usage=response_usage(body.get("usage")),
            finish_reason=choices[0].get("finish_reason"),
        )
        if "x_tiergate" in body:
            out["x_tiergate"] = body["x_tiergate"]
        return out

    def stream(self, request_id: str) -> StreamShape:
        return ResponsesStream(self.response, request_id.removeprefix("req_"))

    def param(self, name: str | None) -> str | None:
        return responses_param(name)
