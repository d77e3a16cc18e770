"""Function tools on ``/v1/responses``, as chat's tools and tool calls.

Request: ``tools`` of ``type: "function"`` (``name``, ``description``, ``parameters``,
``strict``) become chat ``tools``; any other type (``web_search``, ``file_search``,
``computer``, ``mcp``, ...) is refused with a 400 naming it (``param: tools``).
``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "name":
...}``) becomes chat's, ``parallel_tool_calls`` is passed on (both only with tools). Input
items ``function_call`` become an assistant message's ``tool_calls`` (consecutive calls,
and calls right after an assistant message, join that message: chat's parallel calls are
one message) and ``function_call_output`` a ``tool`` message. The answer's tool calls are
output items (``gateway.api.responses_items``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from gateway.api.admission import validation_message
from gateway.errors import InvalidRequest

__all__ = [
    "FunctionTools",
    "add_function_call",
    "function_tools",
    "tool_message",
]

_MODES = ("auto", "none", "required")
_M = TypeVar("_M", bound=BaseModel)


class FunctionTool(BaseModel):
    """One ``tools`` item of ``type: "function"``; any other field is refused."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: Annotated[StrictStr, Field(min_length=1)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class _FunctionCall(BaseModel):
    """An input ``function_call`` item (an earlier answer's call; its ``id`` and ``status``
    are not needed)."""

    model_config = ConfigDict(extra="ignore")

    call_id: Annotated[StrictStr, Field(min_length=1)]
    name: Annotated[StrictStr, Field(min_length=1)]
    arguments: StrictStr


class _TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text", "text"]
    text: StrictStr


class _FunctionCallOutput(BaseModel):
    """An input ``function_call_output`` item: the result of a call, text."""

    model_config = ConfigDict(extra="ignore")

    call_id: Annotated[StrictStr, Field(min_length=1)]
    output: StrictStr | list[_TextPart]


def _validated(model: type[_M], data: Any, where: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, location = validation_message(exc)
        if location is None:
            raise InvalidRequest(f"{where}: {message}", param=where) from None
        raise InvalidRequest(f"{where}.{message}", param=f"{where}.{location}") from None


@dataclass(frozen=True, slots=True)
class FunctionTools:
    """A request's tools: the chat fields they become, and what the ``response`` repeats."""

    chat: dict[str, Any] = field(default_factory=dict)
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` of the chat request (those set)."""
    echo: dict[str, Any] = field(default_factory=dict)
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` as a ``response`` object has them."""


def _tool(raw: Any, i: int) -> FunctionTool:
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind != "function":
        raise InvalidRequest(
            f"tools.{i}: tools of type {kind!r} are not supported on /v1/responses (only"
            " function tools are: tiergate runs no hosted tools)",
            param="tools",
        )
    return _validated(FunctionTool, raw, f"tools.{i}")


def _choice(raw: Any, names: frozenset[str]) -> tuple[Any, Any]:
    """``tool_choice`` as chat has it, and as the ``response`` repeats it."""
    if raw in _MODES:
        if raw == "required" and not names:
            raise InvalidRequest("tool_choice 'required' needs tools", param="tool_choice")
        return raw, raw
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        name = raw.get("name")
        if not isinstance(name, str) or name not in names:
            raise InvalidRequest(
                f"tool_choice names the function {name!r}, which is not in tools",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": name}}, {"type": "function", "name": name}
    kind = raw.get("type") if isinstance(raw, Mapping) else raw
    raise InvalidRequest(
        f"tool_choice {kind!r} is not supported (auto, none, required or a function are)",
        param="tool_choice",
    )


def function_tools(tools: list[Any] | None, choice: Any, parallel: bool | None) -> FunctionTools:
    """The chat fields of a request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``.
    Without tools, the other two are checked and repeated but not sent: chat APIs refuse them
    without ``tools``, and they mean nothing there."""
    specs = [_tool(raw, i) for i, raw in enumerate(tools or [])]
    names = frozenset(spec.name for spec in specs)
    chat_choice, echo_choice = ("auto", "auto") if choice is None else _choice(choice, names)
    chat: dict[str, Any] = {}
    if specs:
        chat["tools"] = [
            {"type": "function", "function": spec.model_dump(exclude={"type"}, exclude_none=True)}
            for spec in specs
        ]
        if choice is not None:
            chat["tool_choice"] = chat_choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    return FunctionTools(
        chat=chat,
        echo={
            "tools": [spec.model_dump() for spec in specs],
            "tool_choice": echo_choice,
            "parallel_tool_calls": True if parallel is None else parallel,
        },
    )


def add_function_call(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    """Add the input ``function_call`` ``item`` to ``messages``: to the assistant message just
    before it, or as a new one."""
    call = _validated(_FunctionCall, item, where)
    tool_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(tool_call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})


def tool_message(item: Any, where: str) -> dict[str, Any]:
    """The ``tool`` message of an input ``function_call_output`` ``item``."""
    result = _validated(_FunctionCallOutput, item, where)
    output = result.output
    text = output if isinstance(output, str) else "".join(part.text for part in output)
    return {"role": "tool", "tool_call_id": result.call_id, "content": text}
