"""What a run is billed: its ledger entry, and the route and cost its replies carry.

``Billing`` turns a ``Run`` (``gateway.queue.run``) into the ledger row of its job: outcome,
tokens and the attempts they came from (with those of the runs before it: a job taken over from
a worker that died or handed it back books what that worker did, ``gateway.queue.ownership.notes``),
the cost of every attempt that produced tokens and the same tokens priced at the tenant's baseline
model (integer micro-dollars; ``None`` where a price is unknown, flagged and never booked as
zero), the part of the cost priced from estimated usage (``gateway.accounting.estimates``),
timings, and the downgrade tag (``gateway.faults.chains``) when a lower tier than planned
served the answer. The replies carry the same figures: the route with a stream's first chunk
(its headers), cost and tokens with the answer or the stream's end.

A job that no run will finish (its edge took its claim after a run handed it back) is billed the
calls its runs noted, under the answer its owner gave (``noted``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol

from backends.types import Usage
from gateway.accounting.records import Attempt, LedgerEntry, to_micro, to_nano
from gateway.errors import GatewayError
from gateway.faults.chains import DOWNGRADE_TAG, is_downgrade
from gateway.queue.jobs import Job
from gateway.queue.ownership.notes import RunNote
from gateway.queue.run import Run
from gateway.reply_meta import ReplyMeta
from router.catalog import Catalog

__all__ = ["Billing", "PriceLookup"]


class PriceLookup(Protocol):
    """What the executor needs of prices: cost of tokens on a model for a request received at
    ``at`` (``None`` = unknown; GPU pools are priced at that period's rate, the one its budget
    reservation used)."""

    def cost(self, model: str, usage: Usage, at: float | None = None) -> Decimal | None: ...

    def source(self, model: str, at: float | None = None) -> str | None:
        """Where ``model``'s price for a request received at ``at`` comes from (``None``:
        unknown)."""
        ...


class Billing:
    """A run's ledger entry and reply figures, from prices, the catalog and each tenant's
    baseline model (tenant → model, ``None``: no baseline)."""

    def __init__(
        self, prices: PriceLookup, catalog: Catalog, baselines: Mapping[str, str | None]
    ) -> None:
        self._prices = prices
        self._catalog = catalog
        self._baselines = baselines  # read at each booking: TenantDirectory.baselines

    def external(self, deployment: str) -> bool:
        """Served by a hosted API, which bills us (``DeploymentSpec.external``)."""
        spec = self._catalog.get(deployment)
        return spec is not None and spec.external

    def noted(self, job: Job, note: RunNote, answer: GatewayError) -> tuple[LedgerEntry, ReplyMeta]:
        """A job no run will finish, answered ``answer`` by whoever holds it: its entry, which
        books the calls its runs noted (the one in flight as lost: ``RunNote.booked``), and the
        figures its reply carries. Nothing runs now: no deployment answered, no backend time."""
        run = Run(job, time.time(), reclaimed=True)
        run.carried = note.booked(job.body, external=self.external)
        entry = self.entry(run, answer.outcome, answer.status)
        return entry, self.meta(run, entry)

    def served(self, run: Run, deployment: str) -> None:
        """``deployment`` answers the run: it is booked to its tier, flagged when a downgrade."""
        run.deployment = deployment
        run.served_by.append(deployment)
        spec = self._catalog.get(deployment)
        run.downgraded = spec is not None and is_downgrade(run.job.plan.tier, spec.tier)

    def entry(self, run: Run, outcome: str, status: int) -> LedgerEntry:
        job = run.job
        now = time.time()
        attempts = run.booked()
        cost, baseline, known, estimated, nanos = self._costs(job, attempts)
        spec = self._catalog.get(run.deployment) if run.deployment else None
        tags = (*job.tags, DOWNGRADE_TAG) if run.downgraded else job.tags
        return LedgerEntry(
            request_id=job.request_id,
            tenant=job.tenant,
            principal=job.principal,
            created_at=datetime.fromtimestamp(job.received_at, UTC),
            outcome=outcome,
            status_code=status,
            requested_model=job.plan.requested_model,
            tier=spec.tier.value if spec else job.plan.tier.value,
            deployment=run.deployment,
            rule=job.plan.rule,
            score=job.plan.score,
            stream=job.stream,
            app=job.app,
            tags=tags,
            prompt_tokens=sum(a.prompt_tokens for a in attempts),
            completion_tokens=sum(a.completion_tokens for a in attempts),
            cost_micro_usd=cost,
            baseline_micro_usd=baseline,
            price_known=known,
            latency_ms=(now - job.received_at) * 1000,
            ttft_ms=None if run.ttft_at is None else (run.ttft_at - job.received_at) * 1000,
            queue_ms=(run.picked_at - job.enqueued_at) * 1000,
            attempts=attempts,
            idempotency_key=None if job.stream else job.idempotency_key,  # it ran under the key
            estimated_micro_usd=estimated,
            cost_nano_usd=nanos[0],
            baseline_nano_usd=nanos[1],
            price_source=self._sources(job, attempts),
            endpoint=job.endpoint,
        )

    def _sources(self, job: Job, attempts: Sequence[Attempt]) -> str | None:
        """The distinct price sources of the attempts that produced tokens, in order."""
        sources = [
            self._prices.source(a.deployment, job.received_at) or "unknown"
            for a in attempts
            if a.prompt_tokens or a.completion_tokens
        ]
        return "; ".join(dict.fromkeys(sources)) or None

    def _costs(
        self, job: Job, attempts: Sequence[Attempt]
    ) -> tuple[int | None, int | None, bool, int | None, tuple[int | None, int | None]]:
        """Cost and baseline of every attempt that produced tokens, in micro-dollars; ``None``
        where a price is unknown (flagged, never booked as zero). Then whether the price is
        known, and the part of the cost priced from estimated tokens (``None``: no estimate;
        0 when the cost is unknown, as ``LedgerEntry.estimated_micro_usd`` says); last, the
        cost and baseline in nano-dollars."""
        cost: Decimal | None = Decimal(0)
        baseline: Decimal | None = Decimal(0)
        estimated: Decimal | None = None
        baseline_model = self._baselines.get(job.tenant)
        for attempt in attempts:
            if not (attempt.prompt_tokens or attempt.completion_tokens):
                continue
            usage = Usage(attempt.prompt_tokens, attempt.completion_tokens)
            at = job.received_at
            price = self._prices.cost(attempt.deployment, usage, at)
            if job.endpoint == "embeddings":  # no chat model to compare with: no saving
                base = price
            else:
                base = self._prices.cost(baseline_model, usage, at) if baseline_model else None
            cost = None if cost is None or price is None else cost + price
            baseline = None if baseline is None or base is None else baseline + base
            if attempt.estimated:
                estimated = (estimated or Decimal(0)) + (price or Decimal(0))
        if estimated is not None and cost is None:
            estimated = Decimal(0)  # the cost is unknown: none of it is in any sum
        return (
            None if cost is None else to_micro(cost),
            None if baseline is None else to_micro(baseline),
            cost is not None,
            None if estimated is None else to_micro(estimated),
            (
                None if cost is None else to_nano(cost),
                None if baseline is None else to_nano(baseline),
            ),
        )

    def route_meta(self, run: Run) -> ReplyMeta:
        """The route a reply carries (a stream's first chunk: its headers)."""
        spec = self._catalog.get(run.deployment) if run.deployment else None
        return ReplyMeta(
            deployment=run.deployment,
            tier=spec.tier.value if spec else run.job.plan.tier.value,
            queue_ms=(run.picked_at - run.job.enqueued_at) * 1000,
            downgraded=run.downgraded,
        )

    def meta(self, run: Run, entry: LedgerEntry) -> ReplyMeta:
        """The route and accounting a run's last reply carries (answer, stream end, error)."""
        return replace(
            self.route_meta(run),
            cost_usd=entry.cost_usd,
            backend_ms=run.backend_s * 1000,
            wait_ms=run.waited_s * 1000,
            prompt_tokens=entry.prompt_tokens,
            completion_tokens=entry.completion_tokens,
            served_by=tuple(run.served_by),
        )
