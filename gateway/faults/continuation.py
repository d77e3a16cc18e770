"""Continuing a stream that broke after its first token on another deployment.

vLLM's chat API continues an assistant message when asked with ``continue_final_message: true``
and ``add_generation_prompt: false``: the text already delivered goes in as the start of the
assistant message and the model writes only the rest. Hosted APIs (litellm deployments) cannot,
nor can a server that refuses an assistant prefill, and a tool call cannot be resumed from a
text prefix, nor ``n`` answers as one assistant message, so continuation applies only to
plain-text single-choice answers between deployments that accept continuation
(``DeploymentSpec.continues``: the config's ``accepts_continuation``, by default the ``vllm``
ones), and only when the config enables it.
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
    model: str | None = None
    """The ``model`` of the first chunk: every later chunk of the answer says the same."""

    def add(self, chunk: Mapping[str, Any]) -> int:
        """Record one chunk the client got; the content pieces it carried."""
        if self.completion_id is None and isinstance(chunk.get("id"), str):
            self.completion_id = chunk["id"]
        if self.model is None and isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
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

    def as_first(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """A continuation's ``chunk`` under the first completion's id and model, so the
        client sees one answer."""
        same: dict[str, Any] = {}
        if self.completion_id is not None:
            same["id"] = self.completion_id
        if self.model is not None:
            same["model"] = self.model
        return {**chunk, **same} if same else chunk


def can_continue(
    *, enabled: bool, body: Mapping[str, Any], delivered: Delivered, capable: Sequence[bool]
) -> bool:
    """Whether a broken stream may continue: enabled, plain text so far, no tool use asked for,
    and every deployment involved (``capable``: the one that broke, the next) accepts
    continuation."""
    if not enabled or delivered.tool_calls or not delivered.content:
        return False
    if any(body.get(key) for key in _TOOL_KEYS):
        return False
    if body.get("n", 1) not in (None, 1):  # several answers cannot go on as one message
        return False
    return all(capable)


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
