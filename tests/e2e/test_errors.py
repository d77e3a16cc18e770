"""Every refusal: its status, its OpenAI-shaped body, its ledger row; the gateway keeps serving."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from gateway.api.error_docs import ErrorResponse
from tests.support import Stack
from tests.support.ledger import wait_entry

HELLO = [{"role": "user", "content": "hello"}]


def post(
    stack: Stack, *, key: str | None, content: bytes | None = None, body: Any = None
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers=headers,
        content=content,
        json=body if content is None else None,
        timeout=30,
    )


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert error["type"]
    ErrorResponse.model_validate(response.json())  # the body the schema documents
    schema = httpx.get(str(response.request.url.copy_with(path="/openapi.json"))).json()
    route = schema["paths"][response.request.url.path][response.request.method.lower()]
    assert str(status) in route["responses"], f"{status} is not in the route's OpenAPI answers"
    return dict(error)


@pytest.mark.parametrize(
    ("body", "content", "status", "code"),
    [
        (None, b"{not json", 400, "invalid_json"),
        (None, b"[1, 2]", 400, "invalid_json"),
        ({"model": "auto"}, None, 400, "invalid_request"),
        ({"model": "auto", "messages": []}, None, 400, "invalid_request"),
        ({"model": "auto", "messages": "hi"}, None, 400, "invalid_request"),
        (
            {"model": "auto", "messages": [{"role": "wizard", "content": "x"}]},
            None,
            400,
            "invalid_request",
        ),
        ({"model": "auto", "messages": HELLO, "temperature": "hot"}, None, 400, "invalid_request"),
        ({"model": "auto", "messages": HELLO, "n": 9}, None, 400, "invalid_request"),
        ({"model": "auto", "messages": HELLO, "max_tokens": 10**9}, None, 400, "invalid_request"),
        ({"model": "auto", "messages": HELLO * 600}, None, 400, "invalid_request"),
        ({"model": "gpt-9-ultra", "messages": HELLO}, None, 404, "model_not_found"),
    ],
)
async def test_bad_requests_are_refused_and_booked(
    stack: Stack, body: Any, content: bytes | None, status: int, code: str
) -> None:
    response = post(stack, key=stack.key("acme"), body=body, content=content)
    assert_error(response, status, code)
    entry = await wait_entry(stack.database_url, response.headers["x-request-id"])
    assert entry.tenant == "acme"
    assert entry.outcome == code
    assert entry.status_code == status
    assert entry.cost_micro_usd == 0


def test_missing_and_invalid_keys(stack: Stack) -> None:
    assert_error(
        post(stack, key=None, body={"model": "auto", "messages": HELLO}), 401, "missing_api_key"
    )
    assert_error(
        post(stack, key="sk-wrong", body={"model": "auto", "messages": HELLO}),
        401,
        "invalid_api_key",
    )


@pytest.mark.parametrize("model", ["external", "gpt-4o-mini"])
async def test_model_the_tenant_may_not_use(stack: Stack, model: str) -> None:
    response = post(stack, key=stack.key("initech"), body={"model": model, "messages": HELLO})
    assert_error(response, 403, "model_not_allowed")
    entry = await wait_entry(stack.database_url, response.headers["x-request-id"])
    assert entry.tenant == "initech" and entry.outcome == "model_not_allowed"


def test_body_over_the_limit(stack: Stack) -> None:
    big = {"model": "auto", "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}
    assert_error(post(stack, key=stack.key("acme"), body=big), 413, "request_too_large")


@pytest.mark.parametrize(("tenant", "chars"), [("initech", 120_000), ("acme", 600_000)])
async def test_context_too_long_for_every_allowed_deployment(
    stack: Stack, tenant: str, chars: int
) -> None:
    words = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
    response = post(
        stack,
        key=stack.key(tenant),
        body={"model": "auto", "messages": [{"role": "user", "content": words}]},
    )
    assert_error(response, 400, "context_length_exceeded")


async def test_still_serving_after_the_errors(stack: Stack) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key("acme"), max_retries=0
    ) as api:
        completion = await api.chat.completions.create(model="small", messages=HELLO)
    assert completion.choices[0].message.content


def test_non_tenant_principal_cannot_call_models(stack: Stack) -> None:
    from tests.support import TEST_KEYS

    response = post(
        stack, key=TEST_KEYS["TIERGATE_FINANCE_KEY"], body={"model": "auto", "messages": HELLO}
    )
    assert_error(response, 403, "permission_denied")


def test_health_and_metrics_ports(stack: Stack) -> None:
    assert httpx.get(f"{stack.base_url}/healthz").status_code == 200
    ready = httpx.get(f"{stack.base_url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["workers"] == "ok"
    assert httpx.get(f"{stack.base_url}/metrics").status_code == 404
    metrics = httpx.get(f"{stack.admin_url}/metrics")
    assert metrics.status_code == 200
    assert "tiergate_requests_total" in metrics.text
