"""``relayed_error``: a failure the table (``gateway.errors.RELAYED``) does not know, or one
whose status is not its class's, goes by its status, as the edge made it before the table. The
round trip of every failure a worker sends: ``tests/gateway/queue/test_reply_errors.py``."""

from __future__ import annotations

import pytest

from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    UpstreamFailed,
    relayed_error,
)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, InvalidRequest),
        (429, RateLimited),
        (502, UpstreamFailed),
        (503, ServiceUnavailable),
        (504, DeadlineExceeded),
        (500, UpstreamFailed),
        (None, UpstreamFailed),
    ],
)
def test_a_failure_the_table_does_not_know_goes_by_its_status(
    status: int | None, cls: type[GatewayError]
) -> None:
    """A newer worker's failure: the generic class of its status (as the edge made it before
    the table), its code and message kept."""
    body = {"error": {"message": "new", "type": "x", "param": None, "code": "brand_new"}}
    rebuilt = relayed_error(body, status=status)
    assert type(rebuilt) is cls and (rebuilt.code, rebuilt.message) == ("brand_new", "new")


def test_a_known_code_with_another_status_goes_by_its_status() -> None:
    """The status said wins over a code the table knows with another one."""
    body = RateLimited("busy").body()
    rebuilt = relayed_error(body, status=503)
    assert type(rebuilt) is ServiceUnavailable and rebuilt.code == "rate_limit_exceeded"
