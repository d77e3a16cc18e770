"""The public API's OpenAPI schema driven by schemathesis against a real stack (three simulators,
``tiergate serve``, the test Redis, SQLite): no 5xx, no unhandled exception, no hang, and the
gateway still serves afterwards. Slow: CI runs it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from openai import OpenAI
from schemathesis import GenerationMode

from tests.e2e.conftest import Stack, stack
from tests.support import TEST_KEYS, fuzz_examples

__all__ = ["stack"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ACME = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"}
ADMIN = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_ADMIN_KEY']}"}
CALL_TIMEOUT_S = 30.0
"""A request taking longer than this counts as a hang."""


@pytest.fixture(scope="module")
def api_schema(stack: Stack) -> Any:
    schema = schemathesis.openapi.from_url(f"{stack.base_url}/openapi.json")
    return schema


@pytest.fixture(scope="module")
def tally() -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    print(f"\nfuzz: {dict(sorted(counts.items()))}")


CHAT_EXAMPLES = fuzz_examples(500)
OTHER_EXAMPLES = fuzz_examples(50)
"""Per operation and generation mode (valid and invalid data): the chat route gets most.
Scaled by ``TIERGATE_FUZZ_SCALE`` (``tests.support.fuzz_examples``)."""
MODELS = ("auto", "small", "large", "llama-3.1-8b-instruct", "gpt-4o-mini")


def _meaningful(case: Any) -> Any:
    """Valid chat bodies mostly name a model that exists, so they reach routing and backends."""
    if case.path == "/v1/chat/completions" and isinstance(case.body, dict):
        model = case.body.get("model")
        if isinstance(model, str) and len(model) % 4 != 0:
            case.body["model"] = MODELS[len(model) % len(MODELS)]
    return case


def _check(case: Any, tally: Counter[str]) -> None:
    writes_rules = case.path.startswith("/v1/rules") and case.method.upper() != "GET"
    headers = ADMIN if writes_rules else ACME
    response = case.call(headers=headers, timeout=CALL_TIMEOUT_S)  # a hang raises here
    tally["cases"] += 1
    tally[f"{response.status_code // 100}xx"] += 1
    assert response.status_code < 500, (
        f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
    )
    ctype = response.headers.get("content-type") or [""]
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    if response.status_code >= 400 and ctype.startswith("application/json"):
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_public_api(api_schema: Any, tally: Counter[str], mode: GenerationMode) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert any(op.path == "/v1/chat/completions" for op in operations)
    for operation in operations:
        chat = operation.path == "/v1/chat/completions"
        strategy = operation.as_strategy(generation_mode=mode)
        if chat and mode is GenerationMode.POSITIVE:
            strategy = strategy.map(_meaningful)
        examples = CHAT_EXAMPLES if chat else OTHER_EXAMPLES

        @given(case=strategy)
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            _check(case, tally)

        try:
            run()
        except Unsatisfiable:
            # e.g. GET /healthz: no parameter, no body, so no invalid request to make
            assert mode is GenerationMode.NEGATIVE, operation.path
            tally["operations with no invalid input"] += 1
            continue
        tally["operations"] += 1


def test_the_gateway_still_serves(stack: Stack, tally: Counter[str]) -> None:
    assert tally["cases"] >= 2000, tally
    assert tally["5xx"] == 0
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=TEST_KEYS["TIERGATE_KEY_ACME"])
    reply = client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "still there?"}], max_tokens=16
    )
    assert reply.choices[0].message.content
    assert httpx.get(f"{stack.base_url}/readyz").status_code == 200
    log = stack.gateway.output()
    assert "unhandled error" not in log and not re.search(r"^Traceback", log, re.M), log[-3000:]
