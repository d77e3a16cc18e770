"""Parsing a chat-completions body into the few fields the simulator acts on.

Unknown fields are accepted and ignored, as vLLM does. What is checked: ``messages`` (a non-empty
list; ``content`` a string, null or a list of parts whose ``text`` parts are read and whose other
parts are ignored), ``n`` (only 1), ``max_tokens``/``max_completion_tokens`` (>= 1; the latter
wins), ``seed``, ``stop``, ``stream``, ``stream_options.include_usage`` (and vLLM's
``stream_options.continuous_usage_stats``, which acts only with it) and vLLM's
``continue_final_message``/``add_generation_prompt`` pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from backends.sim.errors import SimError

__all__ = ["Message", "SimChatRequest", "parse_chat_request"]


class Message(NamedTuple):
    """One chat message reduced to its role and plain text."""

    role: str
    text: str


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


def _messages(raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad("`messages` must be a non-empty array", "messages")
    out: list[Message] = []
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
            raise _bad("each message must be an object with a string `role`", "messages")
        out.append(Message(item["role"], _content_text(item.get("content"))))
    return tuple(out)


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
    n = _opt_int(body, "n", minimum=1)
    if n is not None and n > 1:
        raise _bad("n > 1 is not supported: the simulator returns a single choice", "n")
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
    )
