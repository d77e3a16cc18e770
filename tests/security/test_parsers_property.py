"""Property tests for the parsers that read untrusted input: the chat request (bytes → admitted
request), request metadata headers, the config file, and the rule language. For any input each
either succeeds or raises its own documented error, never anything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.admission import admit
from gateway.errors import GatewayError
from gateway.settings import LimitsSettings, Settings
from router.capabilities import Capability
from router.rules import RulesInvalid, parse_rules
from tests.support import fuzz_examples

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(
    max_examples=fuzz_examples(1000), deadline=None, suppress_health_check=list(HealthCheck)
)
"""The default suite runs a few examples per parser; the slow suite a thousand each (scaled by
``TIERGATE_FUZZ_SCALE``, ``tests.support.fuzz_examples``)."""


def _few_and_many(check: Callable[..., None], *strategies: Any) -> tuple[Any, Any]:
    many = pytest.mark.timeout(900)(MANY(given(*strategies)(check)))
    return FEW(given(*strategies)(check)), pytest.mark.slow(many)


LIMITS = LimitsSettings(max_body_bytes=64 * 1024, max_messages=16, max_prompt_tokens=4000)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=30,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "root", 3])
content = st.one_of(
    st.text(max_size=200),
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", ""])},
            optional={"text": st.one_of(st.text(max_size=80), st.integers())},
        ),
        max_size=6,
    ),
    json_values,
)
message = st.fixed_dictionaries({"role": roles}, optional={"content": content, "name": scalars})
chat_body = st.fixed_dictionaries(
    {"model": st.one_of(st.sampled_from(["auto", "small", "large", ""]), scalars)},
    optional={
        "messages": st.one_of(st.lists(message, max_size=20), json_values),
        "stream": st.one_of(st.booleans(), scalars),
        "max_tokens": st.one_of(st.integers(min_value=-5, max_value=10**6), scalars),
        "max_completion_tokens": st.integers(min_value=-5, max_value=10**9),
        "n": st.integers(min_value=-1, max_value=5),
        "temperature": st.one_of(st.floats(allow_nan=True), scalars),
        "metadata": st.one_of(
            st.dictionaries(st.text(max_size=20), st.text(max_size=20)), json_values
        ),
        "stream_options": json_values,
        "stop": json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "response_format": json_values,
        "reasoning_effort": json_values,
        "extra_field": json_values,
    },
)
headers = st.dictionaries(
    st.sampled_from(
        [
            "x-tiergate-app",
            "x-tiergate-tags",
            "x-tiergate-priority",
            "x-tiergate-timeout-ms",
            "x-tiergate-conversation-id",
            "idempotency-key",
            "x-other",
        ]
    ),
    st.text(max_size=60),
    max_size=7,
)


def _admits_or_refuses(raw: bytes, head: dict[str, str]) -> None:
    try:
        admitted = admit(raw, head, LIMITS)
    except GatewayError as error:
        assert 400 <= error.status < 500
        assert set(error.body()["error"]) == {"message", "type", "param", "code"}
        return
    assert admitted.max_tokens >= 1
    assert admitted.features.estimated_prompt_tokens <= LIMITS.max_prompt_tokens
    assert admitted.needs <= frozenset(Capability)  # any body: read, never a crash


def _chat_request_structured(body: dict[str, Any], head: dict[str, str]) -> None:
    _admits_or_refuses(json.dumps(body).encode(), head)


def _chat_request_any_bytes(raw: bytes, head: dict[str, str]) -> None:
    _admits_or_refuses(raw, head)


config_sections = st.fixed_dictionaries(
    {},
    optional={
        "server": json_values,
        "redis": st.one_of(
            json_values, st.fixed_dictionaries({"url": scalars, "key_prefix": scalars})
        ),
        "limits": st.dictionaries(
            st.sampled_from(
                ["max_body_bytes", "max_messages", "max_header_bytes", "sse_idle_s", "bogus"]
            ),
            scalars,
        ),
        "deployments": st.lists(
            st.dictionaries(
                st.sampled_from(["model", "tier", "provider", "replicas", "price"]), json_values
            ),
            max_size=3,
        ),
        "tenants": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
        "principals": json_values,
        "unknown": json_values,
    },
)


def _config_is_valid_or_refused(data: dict[str, Any]) -> None:
    try:
        Settings(**data)
    except ValueError:  # pydantic's ValidationError, with the offending key
        return


def _config_yaml_text(text: str) -> None:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    if not isinstance(loaded, dict):
        return
    try:
        Settings(**{str(k): v for k, v in loaded.items()})
    except (ValueError, TypeError):
        return


rule_docs = st.fixed_dictionaries(
    {},
    optional={
        "rules": st.one_of(
            st.lists(
                st.dictionaries(
                    st.sampled_from(
                        ["name", "when", "route", "tier", "app", "tags", "prompt", "score",
                         "priority", "deployments", "max_tokens", "bogus"]
                    ),
                    json_values,
                ),
                max_size=4,
            ),
            json_values,
        ),
        "version": json_values,
    },
)  # fmt: skip


def _rule_language_is_valid_or_refused(text: str) -> None:
    try:
        parse_rules(text)
    except RulesInvalid as exc:
        assert str(exc)


test_chat_request_structured, test_chat_request_structured_many = _few_and_many(
    _chat_request_structured, chat_body, headers
)


test_chat_request_any_bytes, test_chat_request_any_bytes_many = _few_and_many(
    _chat_request_any_bytes,
    st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode())),
    headers,
)


test_config_is_valid_or_refused, test_config_is_valid_or_refused_many = _few_and_many(
    _config_is_valid_or_refused, config_sections
)


test_config_yaml_text, test_config_yaml_text_many = _few_and_many(
    _config_yaml_text, st.text(max_size=300)
)


test_rule_language_is_valid_or_refused, test_rule_language_is_valid_or_refused_many = _few_and_many(
    _rule_language_is_valid_or_refused,
    st.one_of(st.text(max_size=400), rule_docs.map(lambda d: yaml.safe_dump(d))),
)
