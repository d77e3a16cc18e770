"""A queued request (``Job``), the events a worker sends back to the edge (``Reply``), and the
callable a run sends them through (``Emit``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from redis.typing import EncodableT, FieldT

from router.plan import RoutePlan

__all__ = ["Emit", "Job", "Reply", "ReplyKind"]


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

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "request_id": self.request_id,
                "tenant": self.tenant,
                "principal": self.principal,
                "reply_to": self.reply_to,
                "plan": self.plan.to_dict(),
                "body": self.body,
                "stream": self.stream,
                "enqueued_at": self.enqueued_at,
                "deadline": self.deadline,
                "received_at": self.received_at,
                "app": self.app,
                "tags": list(self.tags),
                "priority": self.priority,
                "idempotency_key": self.idempotency_key,
                "conversation": self.conversation,
                **({"traceparent": self.traceparent} if self.traceparent else {}),
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> Job:
        data = orjson.loads(raw)
        return cls(
            request_id=data["request_id"],
            tenant=data["tenant"],
            principal=data["principal"],
            reply_to=data["reply_to"],
            plan=RoutePlan.from_dict(data["plan"]),
            body=data["body"],
            stream=bool(data["stream"]),
            enqueued_at=float(data["enqueued_at"]),
            deadline=float(data["deadline"]),
            received_at=float(data["received_at"]),
            app=data.get("app"),
            tags=tuple(data.get("tags", ())),
            priority=data.get("priority", "standard"),
            idempotency_key=data.get("idempotency_key"),
            conversation=data.get("conversation"),
            traceparent=data.get("traceparent"),
        )


ReplyKind = Literal["chunk", "result", "error", "end"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One event on an edge's reply stream.

    - ``chunk``: ``data`` is a chat.completion.chunk; ``meta`` on the first one names the
      deployment that answers (tier, model, rule).
    - ``result``: ``data`` is the chat.completion body; ``meta`` has routing and accounting.
    - ``error``: ``data`` is an OpenAI error body, ``meta["status"]`` its HTTP status.
    - ``end``: a stream finished (successfully or not); ``meta`` has accounting.
    """

    request_id: str
    kind: ReplyKind
    data: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[FieldT, EncodableT]:
        payload: dict[str, Any] = {"d": self.data}
        if self.meta:
            payload["m"] = self.meta
        return {"r": self.request_id, "k": self.kind, "p": orjson.dumps(payload)}

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Reply:
        payload = orjson.loads(fields[b"p"])
        kind = fields[b"k"].decode()
        if kind not in ("chunk", "result", "error", "end"):
            raise ValueError(f"unknown reply kind {kind!r}")
        return cls(
            request_id=fields[b"r"].decode(),
            kind=kind,  # type: ignore[arg-type]
            data=payload["d"],
            meta=payload.get("m", {}),
        )


Emit = Callable[[Reply], Awaitable[None]]
"""How a run sends its replies: to the edge's reply stream, or straight to a client waiting in
this process (a job started at once)."""
