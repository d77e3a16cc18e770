"""The refusals in the OpenAPI schemas: what a route can answer besides success, in the one body
every refusal has (``GatewayError.body``, the OpenAI error shape).

FastAPI documents a ``422`` with its own validation body on every route that takes input;
tiergate never sends that one (``gateway.api.errors`` answers a request that does not fit its
schema with a ``400 invalid_request``). A client generated from the schema would expect the wrong
status and the wrong body, so ``drop_validation_422`` takes FastAPI's out, and each router names
its refusals with ``refusals(...)`` (``responses=`` of an ``APIRouter`` or a route). The chat
route's own 422 (``idempotency_key_mismatch``) is documented with the error body and stays.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

__all__ = ["ErrorResponse", "drop_validation_422", "refusals"]

_AUTHENTICATED = (401, 403, 500, 503)
"""What any route behind a key can answer: no or a bad key, a key without the route's role, a
bug, and Redis or the database unreachable."""

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 1},
    }
}

_SHOULD_RETRY = {
    "x-should-retry": {
        "description": "`false` where sending the same request again cannot help (a hard "
        "budget spent, a conflict); the official OpenAI SDKs then do not retry.",
        "schema": {"type": "string", "enum": ["true", "false"]},
    }
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every refusal's body (OpenAI's error shape)."""

    error: ErrorDetail


def refusals(*statuses: int, authenticated: bool = True) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a router or route: ``statuses``, and with ``authenticated`` those of
    every route behind a key. ``429`` and ``503`` carry ``Retry-After`` when it is known, ``409``,
    ``422`` and ``429`` ``x-should-retry: false`` where a retry cannot help."""
    documented: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, *(_AUTHENTICATED if authenticated else ())}):
        entry: dict[str, Any] = {
            "model": ErrorResponse,
            "description": HTTPStatus(status).phrase,
        }
        if status in (429, 503):
            entry["headers"] = dict(_RETRY_AFTER)
        if status in (409, 422, 429):
            entry["headers"] = {**entry.get("headers", {}), **_SHOULD_RETRY}
        documented[status] = entry
    return documented


_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")
"""The component schemas FastAPI adds for its 422 body."""


def _fastapis(response: Any) -> bool:
    """Whether a documented response is FastAPI's 422 (its validation body), not ours."""
    return isinstance(response, dict) and "HTTPValidationError" in str(response.get("content"))


def _without_422(schema: dict[str, Any]) -> dict[str, Any]:
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and _fastapis(operation.get("responses", {}).get("422")):
                operation["responses"].pop("422")
    components = schema.get("components", {}).get("schemas", {})
    for name in _FASTAPI_VALIDATION:
        components.pop(name, None)
    return schema


def drop_validation_422(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI schema (built once, on first request, as FastAPI does) leave out
    FastAPI's 422 answers and their body schemas."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _without_422(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    openapi_version=app.openapi_version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    setter: Callable[[], dict[str, Any]] = openapi
    app.openapi = setter  # type: ignore[method-assign]
