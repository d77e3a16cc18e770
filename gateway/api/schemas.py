"""The public wire schema: what a chat-completions request may contain.

Known OpenAI fields are validated; unknown top-level fields are kept and passed through to
OpenAI-compatible backends (vLLM takes ``top_k``, ``min_p``, guided decoding, …).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "SamplingRequest",
    "StreamOptions",
    "TextPart",
]

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Role
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None


class SamplingRequest(BaseModel):
    """What a chat and a (legacy) text completions request share: the model, streaming, and
    the sampling parameters, each validated as OpenAI documents it."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: int | None = None
    user: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)
