"""The OpenAPI schemas document the refusals tiergate sends (OpenAI-shaped bodies), never
FastAPI's 422, which it does not send (the chat route's own 422, an idempotency key reused with
another body, has the error body)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.api.error_docs import ErrorResponse, refusals
from gateway.app import create_app
from gateway.errors import GatewayError
from gateway.settings import load_settings
from tests.gateway.auth.conftest import EXAMPLE

ERROR_REF = "#/components/schemas/ErrorResponse"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    app = create_app(load_settings(EXAMPLE, simulators=[]), dev=True)  # not started
    return app.openapi()


def _operations(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{method.upper()} {path}": operation
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    }


MODEL_ROUTES = (
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/responses",
    "POST /v1/embeddings",
)
"""The routes that run a model (the edge service): each has its own 422, an idempotency key
reused with another body."""


def test_no_fastapi_422_anywhere(schema: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in json.dumps(schema)
    for name, operation in _operations(schema).items():
        if name not in MODEL_ROUTES:
            assert "422" not in operation["responses"], name
    for name in MODEL_ROUTES:
        own = _operations(schema)[name]["responses"]["422"]
        assert own["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}


def test_every_keyed_route_documents_its_refusals_with_the_error_body(
    schema: dict[str, Any],
) -> None:
    keyed = {
        k: op for k, op in _operations(schema).items() if not k.endswith(("healthz", "readyz"))
    }
    assert keyed
    for name, operation in keyed.items():
        responses = operation["responses"]
        for status in ("401", "403", "500", "503"):
            body = responses[status]["content"]["application/json"]["schema"]
            assert body == {"$ref": ERROR_REF}, name


def test_the_chat_route_documents_what_it_refuses_with(schema: dict[str, Any]) -> None:
    responses = _operations(schema)["POST /v1/chat/completions"]["responses"]
    assert set(responses) == {
        "200", "400", "401", "403", "404", "409", "413", "422", "429", "500", "502", "503",
        "504",
    }  # fmt: skip
    assert "Retry-After" in responses["429"]["headers"]


def test_the_documented_body_is_what_every_refusal_sends() -> None:
    errors = [GatewayError("x"), *(cls("y") for cls in _subclasses(GatewayError))]
    for error in errors:
        assert ErrorResponse.model_validate(error.body()).error.code == error.code


def test_refusals_adds_the_keyed_routes_statuses_unless_told_otherwise() -> None:
    assert set(refusals(409)) == {401, 403, 409, 500, 503}
    assert set(refusals(404, authenticated=False)) == {404}


def _subclasses(cls: type[GatewayError]) -> list[type[GatewayError]]:
    found: list[type[GatewayError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found
