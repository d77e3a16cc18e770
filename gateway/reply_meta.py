"""What a worker tells the edge beside a reply's body (``ReplyMeta``), and its one codec.

A reply (``gateway.queue.jobs.Reply``) carries a body (an OpenAI answer, chunk or error body)
and these figures: the route (the deployment that answered and its tier: a stream's headers),
the time spent outside the gateway (queue wait, backend time, waits between retries), the
tokens and cost booked, and, on an error, the HTTP status, the backend's ``Retry-After`` and the
ledger's name for the failure when it is not the body's code. The edge marks a repeat's answer
``replayed`` (``gateway.limits.idempotency``).

On the wire (a reply stream's entry, a kept answer) they are a flat JSON object, the same one a
worker has always written (``to_values``): a field at its default is left out, and
``from_values`` gives a missing key its default, ignores keys it does not know and coerces the
rest, so an edge and a worker of different versions read each other's replies during a
rolling upgrade. Nothing else reads these keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gateway.codec import RecordCodec

__all__ = ["ReplyMeta"]


@dataclass(frozen=True, slots=True)
class ReplyMeta:
    """A reply's figures (``gateway.queue.billing`` makes them). A stream's first chunk carries
    the route and ``backend_ms``; the answer, the stream's end and an error after a run carry
    them all; an error before any run only its ``status``."""

    deployment: str | None = None
    """The deployment that answered (``None``: none did)."""
    tier: str | None = None
    """Its tier, else the plan's. ``None``: the reply carries no route (``over``)."""
    queue_ms: float = 0.0
    """From the edge's enqueue to a worker's pick."""
    downgraded: bool = False
    """Served by a lower tier than planned (``gateway.faults.chains``)."""
    backend_ms: float | None = None
    """Time spent in backend calls (``None``: not said)."""
    wait_ms: float = 0.0
    """Waits between retries (a backend's ``Retry-After``, backoff)."""
    cost_usd: Decimal | None = None
    """What the ledger books (``None``: a price is unknown, or not said)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    served_by: tuple[str, ...] = ()
    """Every deployment that wrote part of the answer, in order."""
    status: int | None = None
    """An error reply's HTTP status."""
    retry_after: float | None = None
    """An error's ``Retry-After`` (the backend's), in seconds."""
    outcome: str | None = None
    """The ledger's name for an error when it is not the body's code
    (``GatewayError.booked_as``)."""
    replayed: bool = False
    """A repeat's answer: its first request's (set by the edge, never sent)."""

    @property
    def cost_text(self) -> str | None:
        """``cost_usd`` as plain decimal text (``0.00000002``, never ``2E-8``)."""
        return None if self.cost_usd is None else f"{self.cost_usd:f}"

    def over(self, earlier: ReplyMeta) -> ReplyMeta:
        """These figures, with what they do not carry taken from ``earlier`` (a stream's end or
        error over its first chunk's: the route, when this reply has none, and backend time)."""
        route = earlier if self.tier is None else self
        return dataclasses.replace(
            self,
            deployment=route.deployment,
            tier=route.tier,
            queue_ms=route.queue_ms,
            downgraded=route.downgraded,
            backend_ms=earlier.backend_ms if self.backend_ms is None else self.backend_ms,
        )

    def to_values(self) -> dict[str, Any]:
        """The wire form: a flat JSON object, fields at their default left out."""
        return _CODEC.to_values(self)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ReplyMeta:
        """The figures of a wire form, this version's or an older worker's; ``ValueError``
        for a value of the wrong kind."""
        try:
            return _CODEC.from_values(values)
        except (TypeError, ArithmeticError) as exc:  # float(None), Decimal("x")
            raise ValueError(f"malformed reply meta: {exc!r}") from exc


def _decimal(value: Any) -> Decimal:
    return Decimal(str(value))


_CODEC = RecordCodec(
    ReplyMeta,
    {Decimal: (lambda cost: f"{cost:f}", _decimal)},
    omit_when_default=frozenset(f.name for f in dataclasses.fields(ReplyMeta)),
)
