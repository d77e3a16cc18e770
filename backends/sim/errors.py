"""Errors the simulator answers with, in each flavour's JSON shape.

vLLM (``vllm/entrypoints/openai/protocol.py``: ``ErrorResponse{error: ErrorInfo}``; ``code`` is
the HTTP status as an integer)::

    {"error": {"message": "...", "type": "BadRequestError", "param": null, "code": 400}}

``type`` is ``BadRequestError`` (400), ``NotFoundError`` (404), ``InternalServerError`` (500),
``NotImplementedError`` (501), else the HTTP reason phrase (``"Too Many Requests"``,
``"Service Unavailable"``), as vLLM's ``GracefulHTTPError`` does.

OpenAI (``code`` is a string identifier or null)::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages",
               "code": "context_length_exceeded"}}

``type`` is ``invalid_request_error`` for 4xx, ``requests`` for 429 and ``server_error`` for 5xx.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from backends.sim.profiles import Flavor

__all__ = [
    "SimError",
    "context_length_exceeded",
    "error_body",
    "error_response",
    "model_not_found",
    "overloaded",
    "rate_limited",
]

_VLLM_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
}


class SimError(Exception):
    """An error answer. ``openai_code`` is the string code used by the OpenAI flavour."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        openai_code: str | None = None,
        retry_after: float | None = None,
        fault: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.openai_code = openai_code
        self.retry_after = retry_after
        self.fault = fault
        """The name of the injected fault that caused this error, if any (for the usage log)."""


def _vllm_type(status: int) -> str:
    if status in _VLLM_TYPES:
        return _VLLM_TYPES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _openai_type(status: int) -> str:
    if status == 429:
        return "requests"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(flavor: Flavor, err: SimError) -> dict[str, Any]:
    """The JSON body for ``err`` in ``flavor``'s shape."""
    if flavor == "vllm":
        info: dict[str, Any] = {
            "message": err.message,
            "type": _vllm_type(err.status),
            "param": err.param,
            "code": err.status,
        }
    else:
        info = {
            "message": err.message,
            "type": _openai_type(err.status),
            "param": err.param,
            "code": err.openai_code,
        }
    return {"error": info}


def error_response(flavor: Flavor, err: SimError) -> web.Response:
    """``err`` as an HTTP response (with ``Retry-After`` when it has one)."""
    headers = {}
    if err.retry_after is not None:
        headers["Retry-After"] = f"{err.retry_after:g}"
    return web.Response(
        status=err.status,
        body=orjson.dumps(error_body(flavor, err)),
        content_type="application/json",
        headers=headers,
    )


def model_not_found(flavor: Flavor, model: str) -> SimError:
    if flavor == "vllm":
        return SimError(404, f"The model `{model}` does not exist.", param="model")
    return SimError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        openai_code="model_not_found",
    )


def context_length_exceeded(
    flavor: Flavor, *, limit: int, prompt_tokens: int, max_tokens: int | None
) -> SimError:
    """vLLM's (v0.25 renderer) or OpenAI's wording for a request over ``max_model_len``."""
    head = f"This model's maximum context length is {limit} tokens. However, "
    if flavor == "vllm":
        if max_tokens is None:
            tail = (
                f"your request has {prompt_tokens} input tokens. "
                "Please reduce the length of the input messages."
            )
        else:
            tail = (
                f"you requested {max_tokens} output tokens and your prompt contains "
                f"{prompt_tokens} input tokens, for a total of {prompt_tokens + max_tokens} "
                "tokens. Please reduce the length of the input prompt or the number of "
                "requested output tokens."
            )
        return SimError(400, head + tail, param="input_tokens")
    if max_tokens is None:
        tail = (
            f"your messages resulted in {prompt_tokens} tokens. "
            "Please reduce the length of the messages."
        )
    else:
        tail = (
            f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
            f"messages, {max_tokens} in the completion). Please reduce the length of the "
            "messages or completion."
        )
    return SimError(400, head + tail, param="messages", openai_code="context_length_exceeded")


def overloaded(flavor: Flavor, retry_after: float, *, fault: str | None = None) -> SimError:
    """503 for a full waiting queue (vLLM's admission cap) or an overloaded API."""
    message = (
        "The server is overloaded: the waiting queue is full. Please retry later."
        if flavor == "vllm"
        else "The engine is currently overloaded, please try again later."
    )
    return SimError(503, message, retry_after=retry_after, fault=fault)


def rate_limited(flavor: Flavor, model: str, retry_after: float) -> SimError:
    message = (
        f"Rate limit reached for {model}. Please try again in {retry_after:g}s."
        if flavor == "openai"
        else f"Too many requests. Please try again in {retry_after:g}s."
    )
    return SimError(
        429,
        message,
        openai_code="rate_limit_exceeded",
        retry_after=retry_after,
        fault="rate_limit",
    )
