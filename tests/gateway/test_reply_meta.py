"""``ReplyMeta`` on the wire, both ways across a rolling upgrade: an older worker's replies
(literal entries, as it wrote them) decode to the same figures, and what this version writes is
what an older edge read, key for key."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
import pytest

from gateway.errors import DeadlineExceeded, InvalidRequest, RateLimited
from gateway.queue.jobs import Reply
from gateway.reply_meta import ReplyMeta

ROUTE = {"deployment": "small-8b", "tier": "small", "queue_ms": 12.5, "downgraded": False}
"""A route as workers have always written it (``Billing.route_meta``)."""
FIGURES = {
    **ROUTE,
    "cost_usd": "0.000000020",
    "backend_ms": 230.5,
    "wait_ms": 0.0,
    "prompt_tokens": 20,
    "completion_tokens": 30,
    "served_by": ["small-8b"],
}
"""An answer's figures as workers have always written them (``Billing.meta``)."""


def _entry(kind: str, payload: bytes) -> dict[bytes, bytes]:
    return {b"r": b"req_1", b"k": kind.encode(), b"p": payload}


def test_an_older_workers_answer_decodes() -> None:
    payload = b'{"d":{"id":"c1"},"m":' + orjson.dumps(FIGURES) + b"}"
    reply = Reply.from_fields(_entry("result", payload))
    assert reply.meta == ReplyMeta(
        deployment="small-8b",
        tier="small",
        queue_ms=12.5,
        cost_usd=Decimal("0.000000020"),
        backend_ms=230.5,
        prompt_tokens=20,
        completion_tokens=30,
        served_by=("small-8b",),
    )
    assert reply.meta.cost_text == "0.000000020"  # never 2E-8


def test_an_older_workers_errors_decode() -> None:
    refused = (
        b'{"d":{"error":{"message":"the model rejected the request: no","type":'
        b'"invalid_request_error","param":null,"code":"invalid_value"}},"m":{"deployment":null,'
        b'"tier":"large","queue_ms":3.0,"downgraded":false,"cost_usd":null,"backend_ms":40.0,'
        b'"wait_ms":0.0,"prompt_tokens":0,"completion_tokens":0,"served_by":[],"status":400,'
        b'"outcome":"backend_rejected"}}'
    )
    reply = Reply.from_fields(_entry("error", refused))
    assert (reply.meta.status, reply.meta.outcome, reply.meta.deployment) == (
        400,
        "backend_rejected",
        None,
    )
    error = reply.error()
    assert type(error) is InvalidRequest
    assert (error.code, error.outcome) == ("invalid_value", "backend_rejected")

    limited = (
        b'{"d":{"error":{"message":"slow down","type":"rate_limit_error","param":null,'
        b'"code":"rate_limit_exceeded"}},"m":{"tier":"large","status":429,"retry_after":7}}'
    )
    error = Reply.from_fields(_entry("error", limited)).error()
    assert type(error) is RateLimited and error.retry_after == 7.0

    unstarted = (
        b'{"d":{"error":{"message":"late","type":"api_error","param":null,"code":"timeout"}},'
        b'"m":{"status":504}}'
    )
    reply = Reply.from_fields(_entry("error", unstarted))
    assert reply.meta == ReplyMeta(status=504) and type(reply.error()) is DeadlineExceeded


def test_an_older_workers_chunks_decode() -> None:
    first = Reply.from_fields(_entry("chunk", b'{"d":{},"m":' + orjson.dumps(ROUTE) + b"}"))
    assert (first.meta.tier, first.meta.deployment, first.meta.queue_ms) == (
        "small",
        "small-8b",
        12.5,
    )
    later = Reply.from_fields(_entry("chunk", b'{"d":{"n":1}}'))  # no figures at all
    assert later.meta == ReplyMeta()


def test_keys_this_version_does_not_know_are_ignored() -> None:
    assert ReplyMeta.from_values({"tier": "small", "from_the_future": [1]}) == ReplyMeta(
        tier="small"
    )


@pytest.mark.parametrize(
    "values", [{"queue_ms": None}, {"cost_usd": "lots"}, {"prompt_tokens": "x"}]
)
def test_a_value_of_the_wrong_kind_is_a_malformed_reply(values: dict[str, Any]) -> None:
    """``ValueError``: the edge's reply reader drops the entry (``ReplyRouter``)."""
    with pytest.raises(ValueError, match=r"malformed reply meta|invalid literal"):
        ReplyMeta.from_values(values)


def _as_written(meta: ReplyMeta) -> dict[str, Any]:
    payload = orjson.loads(Reply("req_1", "result", {}, meta).fields()["p"])
    written: dict[str, Any] = payload.get("m", {})
    return written


def test_what_this_version_writes_is_what_workers_wrote() -> None:
    """Key for key, but for values at their default, which an older edge read as absent."""
    meta = ReplyMeta.from_values(FIGURES)
    assert _as_written(meta) == {k: v for k, v in FIGURES.items() if v}  # not wait_ms 0.0
    limited = Reply.failed("req_1", RateLimited("slow", retry_after=7.0), meta)
    written = orjson.loads(limited.fields()["p"])["m"]
    assert (written["status"], written["retry_after"]) == (429, 7.0) and "outcome" not in written
    assert _as_written(ReplyMeta()) == {}  # a chunk without figures: no "m" at all


def _old_edge(meta: dict[str, Any]) -> tuple[Any, ...]:
    """What an edge before ``ReplyMeta`` read (``gateway.api.relay``), as it read it."""
    return (
        str(meta.get("tier", "")),
        str(meta.get("deployment", "")),
        float(meta.get("queue_ms", 0.0))
        + float(meta.get("backend_ms", 0.0))
        + float(meta.get("wait_ms", 0.0)),
        meta.get("cost_usd"),
        int(meta.get("status", 502)),
        meta.get("retry_after"),
        list(meta.get("served_by") or ()),
        bool(meta.get("downgraded")),
        meta.get("outcome"),
    )


@pytest.mark.parametrize(
    "meta",
    [
        ReplyMeta.from_values(FIGURES),
        ReplyMeta.from_values({**ROUTE, "backend_ms": 4.0}),
        ReplyMeta.from_values({**FIGURES, "downgraded": True, "status": 429, "retry_after": 2}),
        ReplyMeta.from_values({**FIGURES, "status": 400, "outcome": "backend_rejected"}),
        ReplyMeta(status=504),
    ],
)
def test_an_older_edge_reads_the_same_figures(meta: ReplyMeta) -> None:
    assert _old_edge(_as_written(meta)) == (
        meta.tier or "",
        meta.deployment or "",
        meta.queue_ms + (meta.backend_ms or 0.0) + meta.wait_ms,
        meta.cost_text,
        meta.status or 502,
        meta.retry_after,
        list(meta.served_by),
        meta.downgraded,
        meta.outcome,
    )


def test_a_streams_end_or_error_keeps_the_first_chunks_route() -> None:
    """``over``: what a later reply does not carry comes from the first chunk's figures."""
    first = ReplyMeta.from_values({**ROUTE, "backend_ms": 4.0})
    unstarted = ReplyMeta(status=504)  # a run found it past its deadline: no route of its own
    merged = unstarted.over(first)
    assert (merged.deployment, merged.tier, merged.queue_ms, merged.backend_ms) == (
        "small-8b",
        "small",
        12.5,
        4.0,
    )
    assert merged.status == 504
    end = ReplyMeta.from_values({**FIGURES, "tier": "large", "deployment": "large-70b"})
    assert end.over(first) == end  # a run's last reply carries them all
    noted = ReplyMeta(tier="small", status=502)  # booked from a note: nobody answered
    assert noted.over(first).deployment is None
