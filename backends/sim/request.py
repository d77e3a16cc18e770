"""Parsing a chat-completions body into the few fields the simulator acts on.

Unknown fields are accepted and ignored, as vLLM does. What is checked: ``messages`` (a non-empty
list; ``content`` a string, null or a list of parts whose ``text`` parts are read and whose other
parts are ignored; an assistant message's ``tool_calls`` are read as their names and arguments),
``n`` (>= 1), ``max_tokens``/``max_completion_tokens`` (>= 1; the latter
wins), ``seed``, ``stop``, ``stream``, ``stream_options.include_usage`` (and vLLM's
``stream_options.continuous_usage_stats``, which acts only with it) and vLLM's
``continue_final_message``/``add_generation_prompt`` pair; ``logprobs`` / ``top_logprobs`` (0-20,
the latter only with the former, as vLLM checks), ``tools`` (functions: a name and a
``parameters`` schema), ``tool_choice`` (``none``, ``auto``, ``required`` or a named function,
which must be one of ``tools``; anything but ``none``/``auto`` needs ``tools``) and
``response_format`` (``text``, ``json_object``, ``json_schema`` with its ``schema``). Image parts
(``image_url``) are counted, not fetched: ``IMAGE_TOKENS`` each (``IMAGE_TOKENS_LOW`` with
``detail: "low"``), what a vision model's prompt spends on them; a profile without vision
refuses them (``backends.sim.chat``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import orjson

from backends.sim.errors import SimError

__all__ = [
    "Message",
    "ResponseFormat",
    "SimChatRequest",
    "ToolChoice",
    "ToolSpec",
    "parse_chat_request",
]

MAX_TOP_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""
IMAGE_TOKENS = 765
"""Prompt tokens of an image part, as if every image were 1024 x 1024 (OpenAI's tile rule:
4 tiles of 170 tokens plus 85)."""
IMAGE_TOKENS_LOW = 85
"""Prompt tokens of an image part with ``detail: "low"``."""


class Message(NamedTuple):
    """One chat message reduced to its role and plain text (an assistant's tool calls: their
    names and arguments, in ``text`` and, by name, in ``tool_names``)."""

    role: str
    text: str
    tool_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call."""

    name: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    kind: Literal["json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SimChatRequest:
    model: str | None
    messages: tuple[Message, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    """Usage in every chunk (vLLM's ``continuous_usage_stats``, with ``include_usage``)."""
    max_tokens: int | None
    seed: int | None
    stop: tuple[str, ...]
    continue_final: bool
    """Continue the trailing assistant message instead of answering (vLLM only)."""
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice("none")
    response_format: ResponseFormat | None = None
    tools_text: str = ""
    """The tool definitions as the prompt carries them (their tokens count as prompt tokens)."""
    image_tokens: int = 0
    """Prompt tokens of the messages' image parts (0: no image)."""


def _bad(message: str, param: str | None = None) -> SimError:
    return SimError(400, message, param=param, openai_code="invalid_value" if param else None)


def _opt_int(body: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(f"`{key}` must be an integer, got {value!r}", key)
    if minimum is not None and value < minimum:
        raise _bad(f"`{key}` must be at least {minimum}, got {value}", key)
    return value


def _opt_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"`{key}` must be a boolean, got {value!r}", key)
    return value


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping):
                raise _bad("each content part must be an object", "messages")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _bad("a text content part needs a string `text`", "messages")
                texts.append(text)
        return "\n".join(texts)
    raise _bad("message `content` must be a string, an array of parts or null", "messages")


def _image_tokens(raw: Any) -> int:
    """The image parts of ``messages`` (already checked to be a list of objects), in tokens."""
    total = 0
    for message in raw:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image_url":
                image = part.get("image_url")
                low = isinstance(image, Mapping) and image.get("detail") == "low"
                total += IMAGE_TOKENS_LOW if low else IMAGE_TOKENS
    return total


def _tool_calls(raw: Any) -> tuple[tuple[str, ...], str]:
    """The names of an assistant message's tool calls, and the text they stand for."""
    if not isinstance(raw, list):
        return (), ""
    names: list[str] = []
    texts: list[str] = []
    for call in raw:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise _bad("each tool call needs a `function` with a string `name`", "messages")
        names.append(function["name"])
        arguments = function.get("arguments")
        texts.append(f"{function['name']} {arguments if isinstance(arguments, str) else ''}")
    return tuple(names), "\n".join(texts)


def _messages(raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad("`messages` must be a non-empty array", "messages")
    out: list[Message] = []
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
            raise _bad("each message must be an object with a string `role`", "messages")
        text = _content_text(item.get("content"))
        names: tuple[str, ...] = ()
        if item["role"] == "assistant" and item.get("tool_calls"):
            names, calls = _tool_calls(item.get("tool_calls"))
            text = f"{text}\n{calls}" if text else calls
        out.append(Message(item["role"], text, names))
    return tuple(out)


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("`tools` must be an array", "tools")
    out: list[ToolSpec] = []
    for tool in raw:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise _bad("each tool needs a `function` with a string `name`", "tools")
        parameters = function.get("parameters")
        out.append(
            ToolSpec(function["name"], parameters if isinstance(parameters, Mapping) else {})
        )
    return tuple(out)


def _tool_choice(raw: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if raw in ("none", "auto", "required"):
        choice = ToolChoice(raw)
    elif isinstance(raw, Mapping) and isinstance(raw.get("function"), Mapping):
        name = raw["function"].get("name")
        if not isinstance(name, str):
            raise _bad("a named `tool_choice` needs `function.name`", "tool_choice")
        choice = ToolChoice("named", name)
    else:
        raise _bad(f"invalid `tool_choice`: {raw!r}", "tool_choice")
    if choice.mode in ("required", "named") and not tools:
        raise _bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice.name is not None and all(t.name != choice.name for t in tools):
        # vLLM's own message.
        raise _bad(f"Tool '{choice.name}' has not been passed in `tools`.", "tool_choice")
    return choice


def _response_format(raw: Any) -> ResponseFormat | None:
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = raw.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise _bad("`response_format.json_schema.schema` must be an object", "response_format")
        return ResponseFormat("json_schema", schema)
    raise _bad(f"unsupported `response_format` type {kind!r}", "response_format")


def _logprobs(body: Mapping[str, Any]) -> tuple[bool, int]:
    wanted = _opt_bool(body, "logprobs", False)
    top = _opt_int(body, "top_logprobs", minimum=0) or 0
    if top > MAX_TOP_LOGPROBS:
        raise _bad(f"`top_logprobs` must be at most {MAX_TOP_LOGPROBS}, got {top}", "top_logprobs")
    if top and not wanted:
        raise _bad("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    return wanted, top


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return tuple(s for s in raw if s)
    raise _bad("`stop` must be a string or an array of strings", "stop")


def _continue_final(body: Mapping[str, Any], messages: tuple[Message, ...]) -> bool:
    if not _opt_bool(body, "continue_final_message", False):
        return False
    if _opt_bool(body, "add_generation_prompt", True):
        # vLLM's own validation message.
        raise _bad("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if messages[-1].role != "assistant":
        raise _bad("`continue_final_message` needs the last message to be an assistant message")
    return True


def parse_chat_request(body: Any, *, supports_continuation: bool) -> SimChatRequest:
    """Validate ``body`` (decoded JSON); raises ``SimError`` (400) on anything unusable."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("`model` must be a string", "model")
    messages = _messages(body.get("messages"))
    n = _opt_int(body, "n", minimum=1) or 1
    tools = _tools(body.get("tools"))
    logprobs, top_logprobs = _logprobs(body)
    max_tokens = _opt_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", minimum=1)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise _bad("`stream_options` must be an object", "stream_options")
    include_usage = _opt_bool(stream_options or {}, "include_usage", False)
    continuous = _opt_bool(stream_options or {}, "continuous_usage_stats", False)
    return SimChatRequest(
        model=model,
        messages=messages,
        stream=_opt_bool(body, "stream", False),
        include_usage=include_usage,
        continuous_usage=include_usage and continuous,
        max_tokens=max_tokens,
        seed=_opt_int(body, "seed"),
        stop=_stop(body.get("stop")),
        continue_final=supports_continuation and _continue_final(body, messages),
        n=n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        response_format=_response_format(body.get("response_format")),
        tools_text=orjson.dumps(body["tools"]).decode() if tools else "",
        image_tokens=_image_tokens(body["messages"]),
    )
