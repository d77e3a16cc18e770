"""Every Redis key tiergate uses, in one place.

Keys carry a hash tag (``{…}``) so that a Redis Cluster keeps the keys one operation touches in
one slot: everything one tier's scripts touch (its lanes, tenant streams, depth counters,
doorbell, idle workers, replica slot leases, the claims of its requests) shares the tag
``{q:<tier>}``; what is kept about one request across the runs of its job (its stream mark,
``gateway.faults.marks``, and its run note) shares ``{req:<request id>}``. ``prefix`` isolates
deployments (and tests) sharing one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIRECT_LANE", "LANES", "RedisKeys"]

LANES = ("interactive", "standard", "batch")
"""Priority lanes, highest first."""

DIRECT_LANE = "direct"
"""The lane name of the streams that hold jobs started at once or handed straight to an idle
worker: every entry is read into a worker's pending list by the script that adds it."""


@dataclass(frozen=True, slots=True)
class RedisKeys:
    prefix: str = "tg"

    def tier_tag(self, tier: str) -> str:
        """``{prefix}:{q:<tier>}``: the start of every key of one tier's queue."""
        return f"{self.prefix}:{{q:{tier}}}"

    def jobs(self, tier: str, lane: str = "standard", tenant: str = "") -> str:
        """Stream of one tenant's queued jobs in one lane of a tier (consumer group ``workers``)."""
        return f"{self.tier_tag(tier)}:jobs:{lane}:{tenant}"

    def streams(self, tier: str) -> str:
        """Set of every job stream of a tier (where the reclaimer looks for orphaned jobs)."""
        return f"{self.tier_tag(tier)}:streams"

    def lane_tenants(self, tier: str, lane: str) -> str:
        """Sorted set of the tenants with work in a lane, scored by virtual time (fair share)."""
        return f"{self.tier_tag(tier)}:lane:{lane}"

    def depth(self, tier: str, lane: str) -> str:
        """Counter of jobs waiting in a lane (incremented on enqueue, decremented on take)."""
        return f"{self.tier_tag(tier)}:depth:{lane}"

    def bell(self, tier: str) -> str:
        """List a worker blocks on (``BLPOP``) while a tier has no work it may take."""
        return f"{self.tier_tag(tier)}:bell"

    def taken(self, tier: str, lane: str) -> str:
        """Counter of the jobs taken from a lane and started, ever (+1 per take, -1 when the
        worker skips the job): the snapshot's measure of how fast the lane's jobs start
        (deadline admission, docs/queue.md)."""
        return f"{self.tier_tag(tier)}:taken:{lane}"

    def idle(self, tier: str) -> str:
        """Sorted set of the workers waiting for work of a tier with a slot reserved, scored by
        when their registration lapses (ms, Redis clock): an enqueue hands a job to one."""
        return f"{self.tier_tag(tier)}:idle"

    def wake(self, tier: str, worker_id: str) -> str:
        """List of one idle worker (``BLPOP``, with the bell): the job handed to it."""
        return f"{self.tier_tag(tier)}:wake:{worker_id}"

    def slots(self, tier: str, replica: str) -> str:
        """Sorted set of slot leases held on one replica, scored by expiry (ms). Beside the
        tier's slot sets, ``…:slots-epoch`` (``gateway.queue.capacity.epoch_key_of``)."""
        return f"{self.tier_tag(tier)}:slots:{replica}"

    def service_time(self, tier: str) -> str:
        """Moving average of a job's time on a backend (s), for expected waits."""
        return f"{self.tier_tag(tier)}:svc"

    group: str = "workers"

    def replies(self, edge_id: str) -> str:
        """Stream of results and chunks for every in-flight request of one edge process."""
        return f"{self.prefix}:{{e:{edge_id}}}:replies"

    @property
    def cancels(self) -> str:
        """Pub/sub channel: request ids whose client went away (their worker stops them)."""
        return f"{self.prefix}:cancels"

    def claim(self, tier: str, request_id: str) -> str:
        """Who owns a request's outcome: the worker that started it, or the edge that gave up.
        In the tier's slot, so that the enqueue script can take it for an idle worker."""
        return f"{self.tier_tag(tier)}:claim:{request_id}"

    def run_note(self, request_id: str) -> str:
        """What a run of a request's job did so far, for the run that takes the job over
        (``gateway.queue.notes``). Beside its stream mark, in the request's own slot."""
        return f"{self.prefix}:{{req:{request_id}}}:run"

    @property
    def ledger_events(self) -> str:
        """Stream of ledger entries, written to SQL by the sink (consumer group ``ledger``)."""
        return f"{self.prefix}:{{ledger}}:events"

    ledger_group: str = "ledger"

    def worker_heartbeat(self, worker_id: str) -> str:
        """A worker's liveness for readiness checks (``worker_pattern``)."""
        return f"{self.prefix}:workers:{worker_id}"

    def tier_heartbeat(self, tier: str, worker_id: str) -> str:
        """The same, once per tier the worker serves, in the tier's slot: what the reclaim
        script reads, beside the claim key it declares."""
        return f"{self.prefix}:{{q:{tier}}}:workers:{worker_id}"

    @property
    def worker_pattern(self) -> str:
        return f"{self.prefix}:workers:*"
