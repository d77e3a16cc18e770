"""The relay of one streamed attempt: its chunks to the client, and what it delivered.

Each chunk the backend sends is counted in the attempt's ``Streamed`` (chunks received and
sent, content tokens, the last usage it reported, the text of a hosted API's chunks, which
report no usage until the end) and in the stream's ``Delivered`` (the answer so far, which a
continuation resumes: ``gateway.faults.continuation``), then handed to ``emit``. The stream's
first chunk carries the route (the client's headers) and marks the stream as started
(``gateway.faults.marks``); the mark's round trip also carries the run's note
(``gateway.queue.ownership.notes``): this stream in flight, with the usage its first chunk reported,
for a run that takes the job over should this worker die. A continuation drops its opening role-only
chunk and sends its chunks under the first completion's id, so the client sees one answer.

``StreamRelay.relay`` is the per-chunk hot path: keep it tight (one ``emit`` per chunk and no
other await, task or call beyond the chunk's bookkeeping; the mark is written once, with the
first chunk).

One answer, however many deployments wrote it: a continuation's chunks also keep the first
completion's ``model``, and a usage a chunk carries to the client is the request's total so
far (this attempt's and every earlier booked one's, as the ledger row sums them), not the last
attempt's alone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from backends.types import ChatChunk, Usage
from gateway.accounting.estimates import billed_without_usage, estimate, output_text
from gateway.faults.continuation import Delivered, is_role_only
from gateway.faults.marks import StreamMarker
from gateway.queue.billing import Billing
from gateway.queue.jobs import Emit, Reply
from gateway.queue.ownership.notes import CallNotes, InFlight
from gateway.queue.run import Run

__all__ = ["StreamRelay", "Streamed"]


@dataclass(slots=True)
class Streamed:
    """What one streamed attempt delivered so far."""

    body: Mapping[str, Any]
    """The body the attempt sent."""
    external: bool
    """To a hosted API (``DeploymentSpec.external``)."""
    usage: Usage | None = None
    """The last usage the backend reported: at the end, or (vLLM, continuous usage stats) in
    every chunk, so a stream that broke still has its prompt and completion tokens so far."""
    called: bool = False
    """The request went out (the attempt did not end while waiting for a slot)."""
    received: int = 0
    """Chunks the backend sent (the opening role-only one included)."""
    produced: int = 0
    """Content tokens it delivered (one per chunk; an estimate otherwise)."""
    sent: int = 0
    """Chunks it sent to the client."""
    text: list[str] = field(default_factory=list)
    """The text of the chunks that came without usage (a hosted API's), for an estimate."""

    def billed(self, outcome: str, *, unreadable: bool = False) -> tuple[Usage | None, bool]:
        """What the attempt is booked, ending with ``outcome``, and whether it is an estimate:
        the backend's usage; else, when its provider bills the call anyway, an estimate.
        ``unreadable``: its answer arrived but its first event could not be read."""
        if self.usage is not None:
            return self.usage, False
        if billed_without_usage(
            outcome,
            external=self.external,
            sent=self.called,
            answered=self.received > 0,
            unreadable=unreadable,
        ):
            return estimate(self.body, self.text, self.produced), True
        return None, False


def _summed(run: Run, usage: Usage, shown: Mapping[str, Any]) -> dict[str, Any]:
    """``shown`` (a chunk's usage) with the request's totals: ``usage`` plus every call the
    run booked before this one."""
    booked = run.booked()
    prompt = usage.prompt_tokens + sum(a.prompt_tokens for a in booked)
    completion = usage.completion_tokens + sum(a.completion_tokens for a in booked)
    return {
        **shown,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class StreamRelay:
    """Relays streamed attempts to their clients; ``marks``: stream marks for reclaimed runs;
    ``notes``: run notes, written with the marks."""

    def __init__(self, billing: Billing, marks: StreamMarker, notes: CallNotes) -> None:
        self._billing = billing
        self._marks = marks
        self._notes = notes

    async def relay(
        self,
        run: Run,
        emit: Emit,
        deployment: str,
        chunks: AsyncIterator[ChatChunk],
        delivered: Delivered,
        got: Streamed,
    ) -> None:
        """Send one attempt's chunks to the client, counting what it delivered in ``got``."""
        job = run.job
        resumed = run.ttft_at is not None
        got.called = True  # by the first ``anext``
        async for chunk in chunks:
            got.received += 1
            if chunk.usage is not None:
                got.usage = chunk.usage
            else:
                got.text.extend(output_text(chunk.data))
            data = chunk.data
            if resumed:
                if is_role_only(data):
                    continue
                data = delivered.as_first(data)
            if chunk.usage is not None and data.get("usage") and (run.attempts or run.carried):
                data = {**data, "usage": _summed(run, chunk.usage, data["usage"])}
            got.produced += delivered.add(data)
            if run.ttft_at is None:
                await self._first_chunk(run, emit, deployment, data, got)
            else:
                if got.sent == 0:
                    self._billing.served(run, deployment)
                await emit(Reply(job.request_id, "chunk", data))
            got.sent += 1

    async def _first_chunk(
        self, run: Run, emit: Emit, deployment: str, data: dict[str, Any], got: Streamed
    ) -> None:
        """The stream's first chunk to the client: it carries the route (headers)."""
        job = run.job
        run.ttft_at = time.time()
        self._billing.served(run, deployment)
        ttl_s = job.deadline - run.ttft_at + 60
        note = self._notes.command(
            run, InFlight(deployment, run.attempt_at, got.usage, got.produced)
        )
        if not run.local:
            # Before the chunk leaves the process.
            await self._marks.mark(job.request_id, ttl_s, also=note)
        # Backend time to this first chunk: earlier failed attempts, and this one so far.
        backend_ms = (run.backend_s + run.ttft_at - run.attempt_at) * 1000
        meta = replace(self._billing.route_meta(run), backend_ms=backend_ms)
        await emit(Reply(job.request_id, "chunk", data, meta))
        if run.local:
            # The client is in this process: queued after the chunk, whose relay goes first.
            await self._marks.mark(job.request_id, ttl_s, wait=False, also=note)
