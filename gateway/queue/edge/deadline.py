"""Deadline admission: refuse at once a job that cannot start in time, instead of letting it wait
for its 504.

The edge reads the queue snapshot (``QueueSnapshot``: every edge computes it the same way from the
same Redis keys, every 0.5 s) for when a new job of the request's tenant would start in its
lane (``TierView.start_in``: the higher lanes first, then fair share within the lane, at the
tier's throughput or the lane's measured drain rate if slower). It refuses the job when

- at least ``min_waiting`` jobs are ahead of it (a short queue is never refused on an estimate),
  and
- that wait exceeds, by more than ``margin`` (a share), the time the job has left to start: its
  time to the deadline less the tier's typical job time (a worker does not start a job with less
  time left than that, ``ServiceTimes.too_late``).

The refusal is a 429 ``deadline_unreachable`` with ``Retry-After`` (the expected wait, 1-60 s),
booked like every refusal. The check only reads; the enqueue script stays the one atomic step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import RateLimited
from gateway.queue.edge.snapshot import TierView

__all__ = ["DeadlineAdmission"]


@dataclass(frozen=True, slots=True)
class DeadlineAdmission:
    view: Callable[[str], TierView]
    """The snapshot's view of a tier (``QueueSnapshot.view``)."""
    margin: float = 0.1
    min_waiting: int = 16

    def check(
        self, *, tier: str, lane: str, tenant: str, weight: float, time_left_s: float
    ) -> None:
        """Raise ``RateLimited`` (``deadline_unreachable``) when the job cannot start in time."""
        view = self.view(tier)
        higher, in_lane = view.ahead_of(lane, tenant, weight)
        if higher + in_lane < max(self.min_waiting, 1):
            return
        wait = view.start_in(lane, tenant, weight)
        room = time_left_s - view.service_s
        if wait <= max(room, 0.0) * (1.0 + self.margin):
            return
        raise RateLimited(
            f"the request cannot start before its deadline: about {wait:.1f} s of work waits "
            f"ahead of it in the {tier} tier's {lane} lane, and it has {time_left_s:.1f} s left",
            code="deadline_unreachable",
            retry_after=float(min(max(math.ceil(wait), 1), 60)),
        )
