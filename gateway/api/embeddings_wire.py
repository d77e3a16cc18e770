"""What ``POST /v1/embeddings`` accepts, and its batching limits.

``input`` is a string, a list of strings, a list of token ids, or a list of such lists (OpenAI's
four forms); ``encoding_format`` ``float`` or ``base64``; ``dimensions``, ``user`` and unknown
fields pass through to the deployment (vLLM), ``metadata`` is tiergate's (app, tags, …). Every
refusal is a 400 naming the field:

- ``invalid_request``: a malformed ``input`` (empty, an empty string, mixed forms), more inputs
  than ``limits.max_embedding_inputs`` (2048), or all of them over ``limits.max_prompt_chars``;
- ``context_length_exceeded`` (``param``: ``input.<i>``): an input over
  ``limits.max_embedding_input_tokens`` (8192) tokens — estimated for text, counted for token
  ids — or over the chosen deployment's ``max_model_len`` (``EmbeddingInputs.check_fits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from gateway.api.admission import parse_body
from gateway.api.meta import RequestMeta
from gateway.errors import InvalidRequest
from gateway.safe_text import check_name
from gateway.settings import LimitsSettings
from router.features import estimate_tokens

__all__ = ["EmbeddingInputs", "EmbeddingRequest", "admit_embedding"]

SPECIAL_TOKENS_PER_INPUT = 2
"""What an encoder adds around each input (``[CLS]``/``[SEP]``, ``<s>``/``</s>``)."""


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr
    input: Any
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingInputs:
    """An admitted embeddings request."""

    request: EmbeddingRequest
    body: dict[str, Any]
    """What the deployment receives (``model`` and ``metadata`` left out)."""
    meta: RequestMeta
    tokens: tuple[int, ...]
    """Each input's tokens (estimated for text)."""
    bound: int
    """The most prompt tokens the inputs can be (UTF-8 bytes of text, ids counted, plus the
    encoder's special tokens): the budget reservation's."""

    @property
    def estimated_tokens(self) -> int:
        return sum(self.tokens)

    def check_fits(self, deployment: str, max_model_len: int) -> None:
        """400 ``context_length_exceeded`` for the first input over ``max_model_len``."""
        for i, tokens in enumerate(self.tokens):
            if tokens > max_model_len:
                raise InvalidRequest(
                    f"input {i} is about {tokens} tokens; {deployment} takes at most "
                    f"{max_model_len} per input",
                    code="context_length_exceeded",
                    param=f"input.{i}",
                )


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )


def _inputs(value: Any) -> list[str | list[int]]:
    """The inputs of ``input``, one per vector."""
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "input must be a string, a list of strings, a list of token ids or a list of "
            "lists of token ids, not empty",
            param="input",
        )
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"input.{i} is an empty string", param=f"input.{i}")
        elif not _is_ids(item):
            raise InvalidRequest(
                f"input.{i} must be a non-empty string or a non-empty list of token ids "
                "(non-negative integers), as the other inputs are",
                param=f"input.{i}",
            )
    kinds = {isinstance(item, str) for item in value}
    if len(kinds) > 1:
        raise InvalidRequest("input mixes strings and token ids", param="input")
    return value


def admit_embedding(raw: bytes, headers: dict[str, str], limits: LimitsSettings) -> EmbeddingInputs:
    data, request = parse_body(raw, EmbeddingRequest)
    check_name(request.model, param="model", max_chars=limits.max_model_chars)
    if request.user is not None:
        check_name(request.user, param="user", max_chars=limits.max_user_chars)
    inputs = _inputs(request.input)
    if len(inputs) > limits.max_embedding_inputs:
        raise InvalidRequest(
            f"{len(inputs)} inputs in one request; the limit is {limits.max_embedding_inputs}",
            param="input",
        )
    chars = sum(len(item) for item in inputs if isinstance(item, str))
    if chars > limits.max_prompt_chars:
        raise InvalidRequest(
            f"the inputs hold {chars} characters; the limit is {limits.max_prompt_chars}",
            param="input",
        )
    tokens = tuple(estimate_tokens(item) if isinstance(item, str) else len(item) for item in inputs)
    for i, count in enumerate(tokens):
        if count > limits.max_embedding_input_tokens:
            raise InvalidRequest(
                f"input {i} is about {count} tokens; the limit is "
                f"{limits.max_embedding_input_tokens} per input",
                code="context_length_exceeded",
                param=f"input.{i}",
            )
    bound = sum(
        (len(item.encode()) if isinstance(item, str) else len(item)) + SPECIAL_TOKENS_PER_INPUT
        for item in inputs
    )
    return EmbeddingInputs(
        request=request,
        body={k: v for k, v in data.items() if k not in ("model", "metadata")},
        meta=RequestMeta.parse(headers, request.metadata, limits),
        tokens=tokens,
        bound=bound,
    )
