"""A request's timeout: ``x-tiergate-timeout-ms`` or the default, capped, and for a non-streamed
request never longer than the OpenAI SDK's own read timeout (``x-stainless-read-timeout``) less
a margin."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from gateway.api.meta import RequestMeta
from gateway.api.timeout import RequestDeadline, client_read_timeout_s, request_timeout_ms
from gateway.errors import InvalidRequest
from gateway.settings import QueueSettings

QUEUE = QueueSettings()  # default 120 s, at most 600 s
SDK = "x-stainless-read-timeout"


def timeout(
    headers: dict[str, str], *, stream: bool = False, metadata: dict[str, str] | None = None
) -> int:
    meta = RequestMeta.parse(headers, metadata)
    return request_timeout_ms(meta, QUEUE, headers=headers, stream=stream)


def test_without_the_sdk_header_as_before() -> None:
    assert timeout({}) == 120_000
    assert timeout({"x-tiergate-timeout-ms": "2500"}) == 2500
    assert timeout({"x-tiergate-timeout-ms": "900000"}) == 600_000  # capped
    assert timeout({}, metadata={"timeout_ms": "4000"}) == 4000


@pytest.mark.parametrize(
    ("read_timeout", "expected_ms"),
    [
        ("5.0", 4500),  # OpenAI(timeout=5): 10 % margin
        ("5", 4500),
        ("2.5", 2250),
        ("1", 900),
        ("30", 29_000),  # the margin is at most 1 s
        ("119", 118_000),
    ],
)
def test_a_shorter_sdk_timeout_wins_less_a_margin(read_timeout: str, expected_ms: int) -> None:
    assert timeout({SDK: read_timeout}) == expected_ms


@pytest.mark.parametrize("read_timeout", ["0.9", "0.0005", "1e-300", "5e-324"])
def test_a_read_timeout_under_a_second_counts_as_one(read_timeout: str) -> None:
    """Issue 20: ``1e-300`` made a 1 ms deadline, an immediate 504 the client alone caused."""
    assert client_read_timeout_s({SDK: read_timeout}) == 1.0
    assert timeout({SDK: read_timeout}) == 900


@pytest.mark.parametrize("read_timeout", ["600", "600.0", "121", "1e308"])
def test_the_sdk_timeout_never_lengthens_the_deadline(read_timeout: str) -> None:
    assert timeout({SDK: read_timeout}) == 120_000  # the SDK's default 600 s changes nothing
    assert timeout({SDK: read_timeout, "x-tiergate-timeout-ms": "3000"}) == 3000


def test_the_shorter_of_the_sdk_timeout_and_x_tiergate_timeout_ms() -> None:
    assert timeout({SDK: "5", "x-tiergate-timeout-ms": "3000"}) == 3000
    assert timeout({SDK: "5", "x-tiergate-timeout-ms": "10000"}) == 4500
    assert timeout({SDK: "5"}, metadata={"timeout_ms": "60000"}) == 4500


def test_streamed_requests_ignore_the_sdk_timeout() -> None:
    """httpx's read timeout is the longest gap between two chunks, not the whole answer."""
    assert timeout({SDK: "5"}, stream=True) == 120_000
    assert timeout({SDK: "5", "x-tiergate-timeout-ms": "8000"}, stream=True) == 8000


@pytest.mark.parametrize(
    "junk", ["", "soon", "0", "0.0", "-5", "nan", "inf", "-inf", "1e400", "5 s", "None"]
)
def test_an_unusable_sdk_timeout_is_ignored_not_refused(junk: str) -> None:
    assert client_read_timeout_s({SDK: junk}) is None
    assert timeout({SDK: junk}) == 120_000


@pytest.mark.parametrize("bad", ["soon", "0", "-5", "2.5"])
def test_x_tiergate_timeout_ms_stays_strict(bad: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        timeout({SDK: "5", "x-tiergate-timeout-ms": bad})
    assert info.value.param == "x-tiergate-timeout-ms"


def test_the_deadline_from_the_edges_headers() -> None:
    """The edge passes the request's headers (case-insensitive) as they are."""
    headers = Headers(headers={"X-Stainless-Read-Timeout": "5.0"})
    deadline = RequestDeadline.of(RequestMeta(), QUEUE, 1000.0, headers=headers, stream=False)
    assert (deadline.timeout_ms, deadline.at) == (4500, 1004.5)
    assert deadline.left_s(1001.0) == pytest.approx(3.5)
    streamed = RequestDeadline.of(RequestMeta(), QUEUE, 1000.0, headers=headers, stream=True)
    assert streamed.timeout_ms == 120_000
