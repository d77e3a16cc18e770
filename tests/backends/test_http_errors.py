"""The translation table of ``backends.http_errors`` (pure functions; litellm's half is tested
in test_litellm_backend.py, which imports litellm anyway)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from backends.errors import (
    BackendConnectError,
    BackendError,
    BackendNotConfigured,
    BackendProtocolError,
    BackendRateLimited,
    BackendRejected,
    BackendStreamCut,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
)
from backends.http_errors import (
    error_from_aiohttp,
    error_from_payload,
    error_from_response,
    is_context_length_error,
    parse_retry_after,
)

INFO = aiohttp.RequestInfo(
    URL("http://h/"), "POST", CIMultiDictProxy(CIMultiDict()), URL("http://h/")
)
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("soon", None),
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30.0),
        ("Thu, 01 Jan 2026 12:00:45 GMT", 45.0),
        (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 0.0),
    ],
)
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def body(obj: Any) -> bytes:
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    ("status", "raw", "cls", "message"),
    [
        (429, body({"error": {"message": "rate limited"}}), BackendRateLimited, "rate limited"),
        (500, b"<html>oops</html>", BackendUnavailable, "<html>oops</html>"),
        (502, b"", BackendUnavailable, "HTTP 502"),
        (
            503,
            body({"object": "error", "message": "busy", "code": 503}),
            BackendUnavailable,
            "busy",
        ),
        (408, b"", BackendTimeout, "HTTP 408"),
        (401, body({"error": {"message": "bad key"}}), BackendNotConfigured, "bad key"),
        (403, body({"error": "forbidden"}), BackendNotConfigured, "forbidden"),
        (
            404,
            body({"object": "error", "message": "The model `x` does not exist."}),
            BackendRejected,
            "does not exist",
        ),
        (422, body({"detail": [{"msg": "field required"}]}), BackendRejected, "field required"),
        (
            400,
            body({"error": {"message": "", "type": "BadRequestError"}}),
            BackendRejected,
            "BadRequestError",
        ),
        (400, b"not json", BackendRejected, "not json"),
        (
            400,
            body(
                {
                    "object": "error",
                    "message": "This model's maximum context length is 8192 tokens.",
                }
            ),
            ContextLengthExceeded,
            "8192",
        ),
        (
            400,
            body(
                {
                    "error": {
                        "message": "The decoder prompt (length 9000) is longer than the "
                        "maximum model length of 8192."
                    }
                }
            ),
            ContextLengthExceeded,
            "9000",
        ),
        (
            400,
            body({"error": {"message": "too long", "code": "context_length_exceeded"}}),
            ContextLengthExceeded,
            "too long",
        ),
        (302, b"", BackendProtocolError, "unexpected HTTP status 302"),
    ],
)
def test_error_from_response(
    status: int, raw: bytes, cls: type[BackendError], message: str
) -> None:
    err = error_from_response(status, {}, raw, backend="b")
    assert type(err) is cls
    assert err.status == status and err.backend == "b"
    assert message in err.message


def test_retry_after_on_429_and_503_only_when_sent() -> None:
    headers = {"Retry-After": "3"}
    assert error_from_response(429, headers, b"", backend="b").retry_after == 3.0
    assert error_from_response(503, headers, b"", backend="b").retry_after == 3.0
    assert error_from_response(429, {}, b"", backend="b").retry_after is None


def test_long_messages_are_truncated() -> None:
    err = error_from_response(400, {}, body({"message": "x" * 10_000}), backend="b")
    assert len(err.message) == 1000


@pytest.mark.parametrize(
    ("message", "code", "expected"),
    [
        ("This model's maximum context length is 4096 tokens", None, True),
        ("prompt is longer than the maximum model length of 32768", None, True),
        ("whatever", "context_length_exceeded", True),
        ("max_tokens must be at least 1", None, False),
        (None, None, False),
    ],
)
def test_is_context_length_error(message: str | None, code: object, expected: bool) -> None:
    assert is_context_length_error(message, code) is expected


@pytest.mark.parametrize(
    ("payload", "cls"),
    [
        ({"id": "c1", "choices": []}, None),
        ({"error": {"message": "engine dead", "code": 500}}, BackendUnavailable),
        ({"error": {"message": "boom"}}, BackendUnavailable),
        ({"object": "error", "message": "bad", "code": 400}, BackendRejected),
        (
            {"object": "error", "message": "maximum context length is 10", "code": 400},
            ContextLengthExceeded,
        ),
    ],
)
def test_error_from_payload(payload: dict[str, Any], cls: type[BackendError] | None) -> None:
    err = error_from_payload(payload, backend="b")
    assert (None if err is None else type(err)) is cls


@pytest.mark.parametrize(
    ("exc", "body_started", "cls"),
    [
        (aiohttp.ConnectionTimeoutError("connect"), False, BackendTimeout),
        (aiohttp.SocketTimeoutError("read"), True, BackendTimeout),
        (TimeoutError(), True, BackendTimeout),
        (aiohttp.ServerDisconnectedError(), False, BackendConnectError),
        (aiohttp.ServerDisconnectedError(), True, BackendStreamCut),
        (aiohttp.ClientPayloadError("cut"), False, BackendConnectError),
        (aiohttp.ClientPayloadError("cut"), True, BackendStreamCut),
        (aiohttp.ClientOSError(104, "reset"), False, BackendConnectError),
        (ConnectionResetError(), True, BackendStreamCut),
        (aiohttp.InvalidURL("nope"), False, BackendNotConfigured),
        (
            aiohttp.ClientResponseError(INFO, (), status=400, message="Bad status"),
            False,
            BackendProtocolError,
        ),
        (aiohttp.ClientError("other"), False, BackendError),
    ],
)
def test_error_from_aiohttp(exc: Exception, body_started: bool, cls: type[BackendError]) -> None:
    err = error_from_aiohttp(exc, backend="b", body_started=body_started, waiting_for="x (1s)")
    assert type(err) is cls and err.backend == "b"


def test_timeout_message_says_what_was_awaited() -> None:
    err = error_from_aiohttp(
        TimeoutError(), backend="b", body_started=True, waiting_for="the next chunk (2s stall)"
    )
    assert "the next chunk (2s stall)" in str(err)
    assert err.retryable


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"error": {"message": "no", "code": "content_policy_violation"}},
         "content_policy_violation"),
        ({"error": {"message": "too long", "code": "context_length_exceeded"}},
         "context_length_exceeded"),
        ({"error": {"message": "bad", "type": "BadRequestError", "code": 400}}, None),  # vLLM's
        ({"object": "error", "message": "bad", "code": 400}, None),
    ],
)  # fmt: skip
def test_the_providers_own_code_is_kept_without_the_replica_name(
    payload: dict[str, object], code: str | None
) -> None:
    error = error_from_response(400, {}, orjson.dumps(payload), backend="llama-8b#0")
    assert error.code == code
    assert "#0" in str(error) and "#0" not in error.message  # the message is the client's
