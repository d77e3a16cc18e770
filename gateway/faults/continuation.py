"""Continuing a stream that broke after its first token on another deployment.

vLLM's chat API continues an assistant message when asked with ``continue_final_message: true``
and ``add_generation_prompt: false``: the text already delivered goes in as the start of the
assistant message and the model writes only the rest. Hosted APIs (litellm deployments) cannot,
and a tool call cannot be resumed from a text prefix, so continuation applies only to plain-text
answers between ``vllm`` deployments, and only when the config enables it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Delivered", "can_continue", "continuation_body", "is_role_only"]

_TOOL_KEYS = ("tools", "functions", "tool_choice", "function_call", "response_format")


@dataclass(slots=True)
class Delivered:
    """What the client has received of a streamed answer so far."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0
    """Content chunks (a backend sends one token per chunk; an estimate otherwise)."""
    tool_calls: bool = False
    completion_id: str | None = None

    def add(self, chunk: Mapping[str, Any]) -> int:
        """Record one chunk the client got; the content pieces it carried."""
        if self.completion_id is None and isinstance(chunk.get("id"), str):
            self.completion_id = chunk["id"]
        pieces = 0
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("tool_calls") or delta.get("function_call"):
                self.tool_calls = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
                pieces += 1
        self.tokens += pieces
        return pieces

    @property
    def content(self) -> str:
        return "".join(self.text)


def can_continue(
    *, enabled: bool, body: Mapping[str, Any], delivered: Delivered, providers: Sequence[str]
) -> bool:
    """Whether a broken stream may continue: enabled, plain text so far, no tool use asked for,
    and every deployment involved (``providers``: the one that broke, the next) speaks vLLM."""
    if not enabled or delivered.tool_calls or not delivered.content:
        return False
    if any(body.get(key) for key in _TOOL_KEYS):
        return False
    return all(p == "vllm" for p in providers)


def continuation_body(body: Mapping[str, Any], delivered: Delivered) -> dict[str, Any]:
    """``body`` with the delivered text as the start of the assistant message."""
    messages = list(body.get("messages") or ())
    messages.append({"role": "assistant", "content": delivered.content})
    out = dict(body)
    out["messages"] = messages
    out["continue_final_message"] = True
    out["add_generation_prompt"] = False
    for key in ("max_tokens", "max_completion_tokens"):
        limit = out.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            out[key] = max(1, limit - delivered.tokens)
    return out


def is_role_only(chunk: Mapping[str, Any]) -> bool:
    """The opening chunk of a stream (role, no text, no finish): a continuation drops it."""
    choices = chunk.get("choices") or ()
    if not choices:
        return False
    for choice in choices:
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") or delta.get("content") or delta.get("tool_calls"):
            return False
    return True
