"""A ``response`` object's output items and usage, from a chat answer.

The answer's text is a ``message`` item (``output_text``); each of its tool calls a
``function_call`` item whose ``call_id`` is the chat tool call's id, after the message. An
answer with tool calls and no text has no message item, as OpenAI's; one with neither has an
empty message. A tool call the output limit cut is ``incomplete``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["call_item_id", "function_call_item", "output_items", "response_usage", "text_item"]


def response_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def text_item(message_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item_id(base: str, index: int) -> str:
    """The id of the ``function_call`` item of a response's tool call ``index``."""
    return f"fc_{base}_{index}"


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(base: str, message: Mapping[str, Any], *, cut: bool) -> list[dict[str, Any]]:
    """The output of a non-streamed answer whose chat ``message`` is given; ``cut``: by the
    output limit (its last tool call is then ``incomplete``)."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
    out = [text_item(f"msg_{base}", text, "completed")] if text or not calls else []
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        out.append(
            function_call_item(
                call_item_id(base, index),
                str(call.get("id") or f"call_{base}_{index}"),
                str(function.get("name") or ""),
                str(function.get("arguments") or ""),
                "incomplete" if cut and index == len(calls) - 1 else "completed",
            )
        )
    return out
