from __future__ import annotations

import pytest

from gateway.api.meta import RequestMeta
from gateway.errors import InvalidRequest


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
