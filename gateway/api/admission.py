"""From raw bytes to an admitted request: size limit, JSON, schema, limits. Nothing here has
touched Redis or a backend yet, so a bad request costs nothing downstream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from gateway.api.meta import RequestMeta
from gateway.api.schemas import ChatCompletionRequest, ChatMessage
from gateway.errors import ClientDisconnected, InvalidRequest, PayloadTooLarge
from gateway.safe_text import check_name, find_nul
from gateway.settings import LimitsSettings
from router.capabilities import (
    Capability,
    hint_fields,
    needed_capabilities,
    no_reasoning_fields,
)
from router.features import PromptFeatures, definition_tokens

__all__ = ["Admitted", "admit", "parse_body", "read_body", "validation_message"]

_M = TypeVar("_M", bound=BaseModel)

_NOT_PASSED_THROUGH = ("model", "metadata")
"""Fields the gateway consumes: ``model`` is chosen per deployment, ``metadata`` is tiergate's."""


@dataclass(frozen=True, slots=True)
class Admitted:
    request: ChatCompletionRequest
    body: dict[str, Any]
    """What backends receive (the client's body, unknown fields kept)."""
    meta: RequestMeta
    features: PromptFeatures
    max_tokens: int
    """Output budget of one choice, used for context fit: the client's limit, or the
    configured default."""

    @property
    def needs(self) -> frozenset[Capability]:
        """The capabilities a deployment needs to serve it: images, tools, a JSON schema,
        reasoning parameters (``router.capabilities``), read off the body backends receive."""
        return needed_capabilities(self.body)

    @property
    def hints(self) -> tuple[str, ...]:
        """Its reasoning parameters and ``verbosity``: hints, not needs, when it names its model
        through an alias (``router.capabilities.hint_fields``)."""
        return hint_fields(self.body)

    @property
    def quiet_hints(self) -> tuple[str, ...]:
        """Its reasoning fields that ask for no reasoning: hints however it names its model
        (``router.capabilities.no_reasoning_fields``)."""
        return no_reasoning_fields(self.body)

    @property
    def choices(self) -> int:
        """``n``: how many answers the backend writes (each up to ``max_tokens``)."""
        return self.request.n or 1

    @property
    def output_budget(self) -> int:
        """The most output tokens the request can be billed for: every choice's limit."""
        return self.max_tokens * self.choices


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:  # gone, or too slow (server.body_timeout_s): booked 499
        raise ClientDisconnected("the client went away before its body arrived") from exc
    return b"".join(chunks)


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors(include_url=False)[0]
    location = ".".join(str(p) for p in first.get("loc", ()))
    return f"{location or 'body'}: {first.get('msg', 'invalid value')}", location or None


def _may_omit_content(message: ChatMessage) -> bool:
    """Only an assistant message that calls tools (or a function) may have no content."""
    extra = message.model_extra or {}
    return message.role == "assistant" and bool(
        extra.get("tool_calls") or extra.get("function_call")
    )


def _check_content(request: ChatCompletionRequest, limits: LimitsSettings) -> None:
    """Content parts and characters of text, across every message."""
    parts = chars = 0
    for i, message in enumerate(request.messages):
        if message.content is None and not _may_omit_content(message):
            # OpenAI's rule; litellm also fails on it in a way that looks like a broken backend.
            raise InvalidRequest(
                f"messages.{i}.content is required for role {message.role!r}",
                param=f"messages.{i}.content",
            )
        chars += len(message.name or "")
        if isinstance(message.content, str):
            chars += len(message.content)
        elif message.content is not None:
            parts += len(message.content)
            chars += sum(len(part.text or "") for part in message.content)
    if parts > limits.max_content_parts:
        raise InvalidRequest(
            f"too many content parts: {parts} > {limits.max_content_parts}", param="messages"
        )
    if chars > limits.max_prompt_chars:
        raise InvalidRequest(
            f"the messages hold {chars} characters; the limit is {limits.max_prompt_chars}",
            param="messages",
        )


def parse_body(raw: bytes, model: type[_M]) -> tuple[dict[str, Any], _M]:
    """The JSON object ``raw`` (no string of any field may hold NUL: ``gateway.safe_text``) and
    it validated as ``model``; an OpenAI-shaped 400 for anything else."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    find_nul(raw, data)
    try:
        return data, model.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise InvalidRequest(message, param=param) from None


def admit(raw: bytes, headers: dict[str, str], limits: LimitsSettings) -> Admitted:
    """``raw``: the body as received; ``headers``: lower-case names."""
    data, request = parse_body(raw, ChatCompletionRequest)
    check_name(request.model, param="model", max_chars=limits.max_model_chars)
    if request.user is not None:
        check_name(request.user, param="user", max_chars=limits.max_user_chars)
    if request.n is not None and request.n > limits.max_choices:
        raise InvalidRequest(
            f"n={request.n} is over the limit of {limits.max_choices} choices", param="n"
        )
    if len(request.messages) > limits.max_messages:
        raise InvalidRequest(
            f"too many messages: {len(request.messages)} > {limits.max_messages}",
            param="messages",
        )
    _check_content(request, limits)
    output_limit = request.output_limit
    if output_limit is not None and output_limit > limits.max_output_tokens:
        raise InvalidRequest(
            f"max_tokens {output_limit} exceeds the limit of {limits.max_output_tokens}",
            param="max_tokens",
        )
    meta = RequestMeta.parse(headers, request.metadata, limits)
    features = PromptFeatures.from_messages(
        data["messages"], definition_tokens=definition_tokens(data)
    )
    if features.estimated_prompt_tokens > limits.max_prompt_tokens:
        raise InvalidRequest(
            f"prompt is about {features.estimated_prompt_tokens} tokens; the limit is "
            f"{limits.max_prompt_tokens}",
            code="context_length_exceeded",
            param="messages",
        )
    body = {k: v for k, v in data.items() if k not in _NOT_PASSED_THROUGH}
    return Admitted(
        request=request,
        body=body,
        meta=meta,
        features=features,
        max_tokens=output_limit or limits.default_max_tokens,
    )
