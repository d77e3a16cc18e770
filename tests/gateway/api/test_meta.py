from __future__ import annotations

import pytest

from gateway.api.meta import RequestMeta
from gateway.errors import InvalidRequest
from gateway.settings import LimitsSettings


def test_headers_win_over_metadata() -> None:
    meta = RequestMeta.parse(
        {"x-tiergate-app": "billing", "x-tiergate-tags": "a, b,,c", "idempotency-key": "k1"},
        {"app": "ignored", "priority": "batch", "x-tiergate-timeout-ms": "2500"},
    )
    assert meta.app == "billing"
    assert meta.tags == ("a", "b", "c")
    assert meta.priority == "batch"
    assert meta.timeout_ms == 2500
    assert meta.idempotency_key == "k1"


def test_empty() -> None:
    assert RequestMeta.parse({}, None) == RequestMeta()


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"x-tiergate-priority": "urgent"}, "x-tiergate-priority"),
        ({"x-tiergate-timeout-ms": "soon"}, "x-tiergate-timeout-ms"),
        ({"x-tiergate-timeout-ms": "-5"}, "x-tiergate-timeout-ms"),
    ],
)
def test_bad_values(headers: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        RequestMeta.parse(headers, None)
    assert info.value.param == param


# --- hostile values (issue 20): names only, bounded -------------------------------------------

LIMITS = LimitsSettings(max_app_chars=16, max_tags=3, max_tag_chars=8, max_id_chars=20)


@pytest.mark.parametrize(
    ("headers", "metadata", "param"),
    [
        ({"x-tiergate-app": "a\x00b"}, None, "x-tiergate-app"),
        (None, {"app": "a\x00b"}, "metadata.app"),
        (None, {"x_tiergate_app": "billing\n"}, "metadata.x_tiergate_app"),
        ({"x-tiergate-tags": "ok,b\x7fad"}, None, "x-tiergate-tags"),
        ({"x-tiergate-conversation-id": "c\x1b[2J"}, None, "x-tiergate-conversation-id"),
        ({"idempotency-key": "k\x00"}, None, "idempotency-key"),
        (None, {"idempotency_key": "k\ud800"}, "metadata.idempotency_key"),
        ({"x-tiergate-priority": "batch\x00"}, None, "x-tiergate-priority"),
        ({"x-tiergate-app": "a" * 17}, None, "x-tiergate-app"),
        ({"x-tiergate-tags": "a,b,c,d"}, None, "x-tiergate-tags"),
        ({"x-tiergate-tags": "a,123456789"}, None, "x-tiergate-tags"),
        (None, {"tags": ",".join(f"t{i}" for i in range(100_000))}, "metadata.tags"),
        ({"idempotency-key": "k" * 21}, None, "idempotency-key"),
        (None, {"conversation_id": "c" * 21}, "metadata.conversation_id"),
    ],
)
def test_control_characters_and_sizes_are_refused_naming_the_field(
    headers: dict[str, str] | None, metadata: dict[str, str] | None, param: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        RequestMeta.parse(headers or {}, metadata, LIMITS)
    assert info.value.param == param
    assert "\x00" not in info.value.message and "a" * 17 not in info.value.message


def test_within_the_limits() -> None:
    meta = RequestMeta.parse(
        {"x-tiergate-app": "a" * 16, "x-tiergate-tags": "a, b,a, c,b", "idempotency-key": "k" * 20},
        {"conversation_id": "ünïcode-ok"},
        LIMITS,
    )
    assert meta.app == "a" * 16
    assert meta.tags == ("a", "b", "c")  # distinct, in order: 3 is within the limit
    assert meta.idempotency_key == "k" * 20 and meta.conversation_id == "ünïcode-ok"


def test_the_default_limits() -> None:
    limits = LimitsSettings()
    assert (limits.max_app_chars, limits.max_tags, limits.max_tag_chars) == (128, 16, 64)
    assert (limits.max_user_chars, limits.max_model_chars, limits.max_id_chars) == (256, 256, 256)
