"""Wire types shared by every backend, and by the router (which imports nothing else from here).

A request to a backend is the OpenAI chat body the client sent, with ``model`` set to the
deployment's served model id. Responses keep the backend's JSON body as it came, plus the parsed
``usage`` that billing needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatChunk", "ChatRequest", "ChatResponse", "Usage"]


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
        """Parse an OpenAI ``usage`` object; ``None`` when absent or malformed."""
        if not data:
            return None
        try:
            return cls(int(data["prompt_tokens"]), int(data["completion_tokens"]))
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
