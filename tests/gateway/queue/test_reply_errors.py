"""Every error a worker answers with, made again at the edge (``gateway.errors.RELAYED``): the
worker's ``Reply.failed`` through a real Redis reply stream, then ``Reply.error`` — the same
class, status, code, type, message, param, retry-after and ledger outcome, so the edge's one
HTTP mapping (``gateway.api.errors``) answers what the worker meant."""

from __future__ import annotations

from decimal import Decimal

import pytest
import redis.asyncio as aioredis

from gateway.errors import (
    RELAYED,
    ClientDisconnected,
    ContextTooLong,
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    StreamCut,
    UpstreamFailed,
)
from gateway.queue.client.streams import stream_entries
from gateway.queue.jobs import Reply
from gateway.queue.keys import RedisKeys
from gateway.reply_meta import ReplyMeta


def _rejected(code: str) -> InvalidRequest:
    """A backend's refusal as the executor answers it: the backend's code, booked as ours."""
    error = InvalidRequest(f"the model rejected the request: {code}", code=code)
    error.booked_as = "backend_rejected"
    return error


# As the worker (``Executor``, ``Worker``) and the edge's booking of a handed-back job
# (``NotedBooking``) make them.
SENT: dict[str, GatewayError] = {
    "no deployment": UpstreamFailed(
        "every deployment of the route plan failed (a: timeout)",
        attempts=[{"deployment": "a", "outcome": "timeout"}],
    ),
    "context window": ContextTooLong(
        "the prompt does not fit the model's context window: 9000 > 8192", param="messages"
    ),
    "refused, backend's code": _rejected("invalid_value"),
    "refused, no code": _rejected("backend_rejected"),
    "refused, a code of ours": _rejected("rate_limit_exceeded"),
    "rate limited": RateLimited("the model is rate limited: slow down", retry_after=7.0),
    "rate limited, no retry-after": RateLimited("the model is rate limited: slow down"),
    "deadline": DeadlineExceeded("the request could not start before its deadline"),
    "stream cut": StreamCut("the gateway is shutting down"),
    "shutting down": ServiceUnavailable("the gateway is shutting down", code="shutting_down"),
    "client gone": ClientDisconnected("the client closed the connection"),
}


def test_every_failure_of_the_table_is_sent_above() -> None:
    """A failure added to the table without a round trip here fails."""
    assert {error.outcome for error in SENT.values()} == set(RELAYED)


def _same(rebuilt: GatewayError, sent: GatewayError) -> None:
    assert type(rebuilt) is type(sent)
    assert (rebuilt.status, rebuilt.type, rebuilt.code) == (sent.status, sent.type, sent.code)
    assert (rebuilt.message, rebuilt.param) == (sent.message, sent.param)
    assert (rebuilt.retry_after, rebuilt.retryable) == (sent.retry_after, sent.retryable)
    assert (rebuilt.outcome, rebuilt.booked_as) == (sent.outcome, sent.booked_as)
    assert rebuilt.body() == sent.body()


@pytest.mark.parametrize("name", list(SENT))
async def test_the_edge_makes_the_workers_error_again(
    name: str, redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    sent = SENT[name]
    figures = ReplyMeta(deployment="a", tier="small", cost_usd=Decimal("0.000012"))
    key = RedisKeys(key_prefix).replies("errors")
    await redis_conn.xadd(key, Reply.failed("req_1", sent, figures).fields())
    [(_id, fields)] = stream_entries(await redis_conn.xread({key: b"0-0"}, count=1))
    reply = Reply.from_fields(fields)
    assert reply.kind == "error" and reply.meta.status == sent.status
    assert reply.meta.cost_usd == Decimal("0.000012")  # the figures travel beside it
    _same(reply.error(), sent)


@pytest.mark.parametrize("name", list(SENT))
def test_a_reply_handed_over_in_memory_makes_the_same_error(name: str) -> None:
    """A worker of the edge's own process hands the reply over as it is (no encoding)."""
    _same(Reply.failed("req_1", SENT[name]).error(), SENT[name])
