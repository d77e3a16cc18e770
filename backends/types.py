"""Wire types shared by every backend, and by the router (which imports nothing else from here).

A request to a backend is the OpenAI chat body the client sent, with ``model`` set to the
deployment's served model id. Responses keep the backend's JSON body as it came, plus the parsed
``usage`` that billing needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ChatChunk",
    "ChatRequest",
    "ChatResponse",
    "Endpoint",
    "Usage",
    "stream_options_with_usage",
]

Endpoint = Literal["chat", "embeddings"]
"""The OpenAI API a call goes to: ``/v1/chat/completions``, or ``/v1/embeddings`` (an
embedding deployment; its body is the embeddings request, its answer has no completion)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by the backend (billing uses these, never estimates)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_openai(cls, data: Mapping[str, Any] | None) -> Usage | None:
        """Parse an OpenAI ``usage`` object; ``None`` when absent or malformed. An embeddings
        answer's (``prompt_tokens`` and ``total_tokens``, the same) has no completion: 0."""
        if not data:
            return None
        try:
            prompt = int(data["prompt_tokens"])
            if "completion_tokens" not in data and int(data["total_tokens"]) == prompt:
                return cls(prompt, 0)
            return cls(prompt, int(data["completion_tokens"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One call to one deployment.

    ``body`` is the OpenAI chat-completions body (messages, sampling parameters, pass-through
    fields). The backend overrides ``model`` with ``model`` below and sets ``stream`` itself.
    """

    model: str
    body: Mapping[str, Any]
    request_id: str
    timeout_s: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    endpoint: Endpoint = "chat"
    """``embeddings``: ``body`` is an embeddings request (never streamed)."""
    first_token_s: float | None = None
    """This call's limit on the wait for its first output (a stream's first chunk, a
    non-streamed answer's first byte), over the backend's own; ``math.inf``: none."""
    stall_s: float | None = None
    """This call's limit on the silence between two chunks, over the backend's own;
    ``math.inf``: none."""


def stream_options_with_usage(body: Mapping[str, Any]) -> dict[str, Any]:
    """A stream's ``stream_options``: the caller's, with ``include_usage`` on (its last chunk
    carries the usage). Billing needs every stream's usage, whatever the client asked: this is
    the one place that asks for it, and every adapter sends what it returns."""
    options = body.get("stream_options")
    base = options if isinstance(options, Mapping) else {}
    return {**base, "include_usage": True}


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """A complete, non-streamed answer."""

    body: dict[str, Any]
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class ChatChunk:
    """One SSE ``data:`` object of a streamed answer (``chat.completion.chunk``).

    ``usage`` is set on the chunk that carries it (the final one when
    ``stream_options.include_usage`` is on).
    """

    data: dict[str, Any]
    usage: Usage | None = None
