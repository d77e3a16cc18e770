"""What the ledger stores: one ``LedgerEntry`` per authenticated request, whatever its outcome."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Protocol

__all__ = ["MICRO", "NANO", "Attempt", "Ledger", "LedgerEntry", "to_micro", "to_nano"]

MICRO = Decimal("0.000001")
NANO = Decimal("0.000000001")


def to_nano(amount: Decimal) -> int:
    """USD → integer nano-dollars (half-even): a row's exact cost (a 13-token request on a
    $0.03/Mtok model is 390 n$, where micro-dollars read 0)."""
    return int((amount / NANO).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def to_micro(amount: Decimal, *, rounding: str = ROUND_HALF_EVEN) -> int:
    """USD → integer micro-dollars (half-even; a reservation rounds up); the ledger's
    precision."""
    return int((amount / MICRO).quantize(Decimal(1), rounding=rounding))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One call to one deployment while serving a request."""

    deployment: str
    outcome: str
    """``ok`` or a backend error kind (``timeout``, ``unavailable``, …)."""
    latency_ms: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    estimated: bool = False
    """The tokens are the gateway's estimate, not the backend's count: the backend reported no
    usage for a call its provider bills (``gateway.accounting.estimates``)."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "deployment": self.deployment,
            "outcome": self.outcome,
            "latency_ms": round(self.latency_ms, 3),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "error": self.error,
        }
        if self.estimated:  # absent: the backend's own count (every attempt booked before it)
            data["estimated"] = True
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        return cls(
            deployment=str(data["deployment"]),
            outcome=str(data["outcome"]),
            latency_ms=float(data["latency_ms"]),
            prompt_tokens=int(data.get("prompt_tokens", 0)),
            completion_tokens=int(data.get("completion_tokens", 0)),
            error=data.get("error"),
            estimated=data.get("estimated") is True,
        )


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One row. Money is integer micro-dollars; ``None`` cost means the price is unknown
    (flagged with ``price_known=False``, never booked as zero)."""

    request_id: str
    tenant: str
    principal: str
    created_at: datetime
    """UTC, timezone-aware."""
    outcome: str
    """``ok`` or the error code the client received (``model_not_found``, ``timeout``, …)."""
    status_code: int
    requested_model: str = ""
    tier: str | None = None
    deployment: str | None = None
    rule: str | None = None
    score: float | None = None
    stream: bool = False
    app: str | None = None
    tags: tuple[str, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int | None = 0
    baseline_micro_usd: int | None = 0
    price_known: bool = True
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    queue_ms: float | None = None
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)
    idempotency_key: str | None = None
    """The client's ``idempotency-key``, on the row of the request that ran under it (never on a
    refusal or a repeat): how a repeat is recognised after Redis lost the key."""
    estimated_micro_usd: int | None = None
    """The part of ``cost_micro_usd`` priced from estimated tokens (its attempts flagged
    ``estimated``); ``None`` when every token is a backend's own count. 0 when the price is
    unknown: the row's cost is not in any sum then, so neither is its estimated part."""
    provisional: bool = False
    """Written by the edge for a job a worker had started but that gave no answer in time (the
    client got its 504): a run may still book the request, and its entry then replaces this
    row's bookkeeping once (``gateway.accounting.supersede``). Every other entry is final."""
    superseded_at: datetime | None = None
    """Set by the ledger, never by a writer: when a run's entry replaced the bookkeeping of this
    provisional row (the row still says what the client got)."""
    cost_nano_usd: int | None = None
    """The cost in nano-dollars (``cost_micro_usd`` is it rounded half-even to the micro-dollar,
    what budgets and rollups add up). ``None``: a row booked before nano-dollars were kept
    (its cost is ``cost_micro_usd`` x 1000 exactly), or an unknown price."""
    baseline_nano_usd: int | None = None
    """Likewise for the baseline."""
    price_source: str | None = None
    """Where the prices of its attempts came from (``Price.source``: ``config``, ``litellm
    <version>``, a GPU rate's id, basis and window), ``; ``-joined; ``None`` when no attempt
    produced tokens."""
    endpoint: str = "chat"
    """The API the client called: ``chat`` (``/v1/chat/completions``), ``completions``,
    ``responses`` or ``embeddings``; rows booked before 0009 read ``chat``."""

    @property
    def cost_nano(self) -> int | None:
        """The cost in nano-dollars, from whichever column holds it."""
        if self.cost_nano_usd is not None:
            return self.cost_nano_usd
        return None if self.cost_micro_usd is None else self.cost_micro_usd * 1000

    @property
    def baseline_nano(self) -> int | None:
        if self.baseline_nano_usd is not None:
            return self.baseline_nano_usd
        return None if self.baseline_micro_usd is None else self.baseline_micro_usd * 1000

    @property
    def usage_estimated(self) -> bool:
        """Whether some of the row's tokens are estimates (see ``Attempt.estimated``)."""
        return any(attempt.estimated for attempt in self.attempts)

    @property
    def cost_usd(self) -> Decimal | None:
        nano = self.cost_nano
        return None if nano is None else Decimal(nano) * NANO

    @property
    def estimated_usd(self) -> Decimal | None:
        """``estimated_micro_usd`` in dollars (``None``: nothing estimated)."""
        if self.estimated_micro_usd is None:
            return None
        return Decimal(self.estimated_micro_usd) * MICRO

    @property
    def baseline_usd(self) -> Decimal | None:
        nano = self.baseline_nano
        return None if nano is None else Decimal(nano) * NANO


class Ledger(Protocol):
    """Where ledger entries are written. ``record`` is idempotent by ``request_id``: the first
    entry for an id wins, and a repeat returns ``False`` — except that a run's entry replaces
    the bookkeeping of a provisional one, once (``gateway.accounting.supersede``)."""

    async def record(self, entry: LedgerEntry) -> bool: ...

    async def record_many(self, entries: Sequence[LedgerEntry]) -> frozenset[str]:
        """Book a batch in one transaction; returns the ids that were new."""
        ...

    async def get(self, request_id: str, *, tenant: str | None = None) -> LedgerEntry | None: ...

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...
