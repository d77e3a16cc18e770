"""A queued request (``Job``), the events a worker sends back to the edge (``Reply``), and the
callable a run sends them through (``Emit``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import orjson
from redis.typing import EncodableT, FieldT

from gateway.codec import RecordCodec
from gateway.errors import GatewayError, relayed_error
from gateway.reply_meta import ReplyMeta
from router.plan import RoutePlan

__all__ = ["Emit", "Job", "Reply", "ReplyKind", "reply_kind"]


@dataclass(frozen=True, slots=True)
class Job:
    request_id: str
    tenant: str
    principal: str
    reply_to: str
    """Edge id whose reply stream receives the result."""
    plan: RoutePlan
    body: dict[str, Any]
    stream: bool
    enqueued_at: float
    """Unix time (s) when the edge queued the job."""
    deadline: float
    """Unix time (s) after which the request is answered 504."""
    received_at: float
    app: str | None = None
    tags: tuple[str, ...] = ()
    priority: str = "standard"
    idempotency_key: str | None = None
    """A repeat with the same key (same tenant) gets this job's answer instead of running."""
    conversation: str | None = None
    """The conversation's key (``gateway.rules.sticky.conversation_key``): replica affinity."""
    traceparent: str | None = None
    """W3C trace context of the edge's request span (tracing on); the worker's spans join it.
    Not encoded when ``None``; optional when decoding (jobs queued before it existed)."""
    endpoint: str = "chat"
    """The API the client called (``LedgerEntry.endpoint``). ``embeddings``: ``body`` is an
    embeddings request, sent to the deployment's ``/v1/embeddings``; every other one runs as
    the chat request ``body`` is. Not encoded when ``chat``."""

    def encode(self) -> bytes:
        return orjson.dumps(_JOB.to_values(self))

    @classmethod
    def decode(cls, raw: bytes) -> Job:
        return _JOB.from_values(orjson.loads(raw))


_JOB = RecordCodec(
    Job,
    {RoutePlan: (RoutePlan.to_dict, RoutePlan.from_dict)},
    omit_when_default=frozenset({"traceparent", "endpoint"}),
)
"""Every field of ``Job`` (``gateway.codec``); ``traceparent`` only when set, ``endpoint``
only when not ``chat``."""


ReplyKind = Literal["chunk", "result", "error", "end"]
_REPLY_KINDS: tuple[ReplyKind, ...] = get_args(ReplyKind)


def reply_kind(value: str) -> ReplyKind:
    """``value`` as a ``ReplyKind``; ``ValueError`` for any other word."""
    for kind in _REPLY_KINDS:
        if kind == value:
            return kind
    raise ValueError(f"unknown reply kind {value!r}")


@dataclass(frozen=True, slots=True)
class Reply:
    """One event on an edge's reply stream.

    - ``chunk``: ``data`` is a chat.completion.chunk; ``meta`` on the first one names the
      deployment that answers (tier, model, rule).
    - ``result``: ``data`` is the chat.completion body; ``meta`` has routing and accounting.
    - ``error``: ``data`` is an OpenAI error body, ``meta.status`` its HTTP status
      (``failed``, ``error``).
    - ``end``: a stream finished (successfully or not); ``meta`` has accounting.
    """

    request_id: str
    kind: ReplyKind
    data: dict[str, Any] = field(default_factory=dict)
    meta: ReplyMeta = field(default_factory=ReplyMeta)

    @classmethod
    def failed(cls, request_id: str, error: GatewayError, meta: ReplyMeta | None = None) -> Reply:
        """The ``error`` reply answering ``error``, with the figures of ``meta``."""
        return cls(
            request_id,
            "error",
            error.body(),
            replace(
                meta or ReplyMeta(),
                status=error.status,
                retry_after=error.retry_after,
                outcome=error.booked_as,
            ),
        )

    def error(self) -> GatewayError:
        """The error an ``error`` reply answers, made again (``gateway.errors.RELAYED``)."""
        return relayed_error(
            self.data,
            status=self.meta.status,
            outcome=self.meta.outcome,
            retry_after=self.meta.retry_after,
        )

    def fields(self) -> dict[FieldT, EncodableT]:
        payload: dict[str, Any] = {"d": self.data}
        meta = self.meta.to_values()
        if meta:
            payload["m"] = meta
        return {"r": self.request_id, "k": self.kind, "p": orjson.dumps(payload)}

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Reply:
        payload = orjson.loads(fields[b"p"])
        return cls(
            request_id=fields[b"r"].decode(),
            kind=reply_kind(fields[b"k"].decode()),
            data=payload["d"],
            meta=ReplyMeta.from_values(payload.get("m", {})),
        )


Emit = Callable[[Reply], Awaitable[None]]
"""How a run sends its replies: to the edge's reply stream, or straight to a client waiting in
this process (a job started at once)."""
