"""Every Redis key tiergate uses, in one place.

Keys carry a hash tag (``{…}``) so that a Redis Cluster keeps the keys one operation touches in
one slot: everything one tier's scripts touch (its lanes, tenant streams, depth counters,
doorbell, idle workers, replica slot leases, the claims of its requests) shares the tag
``{q:<tier>}``; what is kept about one request across the runs of its job (its stream mark,
``gateway.faults.marks``, and its run note) shares ``{req:<request id>}``; a tenant's
idempotency keys ``{idem:<t>}``, rate buckets ``{rl:<t>}`` and budgets ``{budget:<t>}``; a
deployment's breaker ``{breaker:<d>}`` and GPU counters ``{gpu:<d>}``; the ledger's streams
``{ledger}``. Keys that no multi-key step touches (channels, heartbeats, counters) carry no tag.
``prefix`` isolates deployments (and tests) sharing one Redis. The Lua scripts name the keys
they touch in ``KEYS`` or get them, or their prefixes, from here in ``ARGV``; tests check that
every script and multi-key command stays in one slot (``tests/gateway/test_key_slots.py``) and
run the whole path on a Redis Cluster (``tests/e2e/test_redis_cluster.py``).
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
        tier's slot sets, ``…:slots-epoch`` (``slots_epoch_of``)."""
        return f"{self.tier_tag(tier)}:slots:{replica}"

    @staticmethod
    def slots_epoch_of(slot_key: str) -> str:
        """The epoch key of the tier whose slot set is ``slot_key`` (``slots``): when its slot
        leases were last restored (``gateway.queue.replicas.capacity``), in the tier's hash tag."""
        return slot_key.rsplit(":slots:", 1)[0] + ":slots-epoch"

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
        (``gateway.queue.ownership.notes``). Beside its stream mark, in the request's own slot."""
        return f"{self.prefix}:{{req:{request_id}}}:run"

    @property
    def ledger_events(self) -> str:
        """Stream of ledger entries, written to SQL by the sink (consumer group ``ledger``)."""
        return f"{self.prefix}:{{ledger}}:events"

    ledger_group: str = "ledger"

    @property
    def ledger_dead_letters(self) -> str:
        """Stream of the ledger events the sink set aside (``gateway.accounting.dead_letters``)."""
        return f"{self.prefix}:{{ledger}}:dead"

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

    # Per request, beside its run note (``{req:<request id>}``).

    def stream_mark(self, request_id: str) -> str:
        """That a request's stream reached its client (``gateway.faults.marks``)."""
        return f"{self.prefix}:{{req:{request_id}}}:stream-started"

    # Per tenant: idempotency keys, rate-limit buckets, budgets (one hash tag each).

    def idempotency_tag(self, tenant: str) -> str:
        """``{prefix}:{idem:<tenant>}``: when the tenant's keys were last lost (a string)."""
        return f"{self.prefix}:{{idem:{tenant}}}"

    def idempotency_claim(self, tenant: str, key: str) -> str:
        """Which request holds an idempotency key (``gateway.limits.idempotency``)."""
        return f"{self.idempotency_tag(tenant)}:k:{key}"

    def idempotency_result(self, tenant: str, key: str) -> str:
        """The final reply of the request that held an idempotency key."""
        return f"{self.idempotency_tag(tenant)}:r:{key}"

    def rate_buckets(self, tenant: str) -> list[str]:
        """A tenant's request and token buckets, and the marks of their rebuild from SQL
        (``gateway.limits.rate``): requests, tokens, seeded, seeding."""
        tag = f"{self.prefix}:{{rl:{tenant}}}"
        return [f"{tag}:requests", f"{tag}:tokens", f"{tag}:seeded", f"{tag}:seeding"]

    def budget_tag(self, tenant: str) -> str:
        """``{prefix}:{budget:<tenant>}``: the start of every budget key of a tenant."""
        return f"{self.prefix}:{{budget:{tenant}}}"

    def budget_open(self, tenant: str) -> str:
        """Sorted set of a tenant's unsettled reservations (``gateway.accounting.budgets``)."""
        return f"{self.budget_tag(tenant)}:open"

    def budget_window(self, tenant: str, budget: str, start: str) -> str:
        """Hash of one budget's window (``spent``, ``reserved``), by the window's first day."""
        return f"{self.budget_tag(tenant)}:b:{budget}:{start}"

    def budget_reservation(self, tenant: str, request_id: str) -> str:
        """What one request reserved; ``budget_reservation(t, "")`` is the prefix the release
        script scans with."""
        return f"{self.budget_tag(tenant)}:res:{request_id}"

    def budget_settled(self, tenant: str, request_id: str) -> str:
        """That a request's reservation was settled (once per request id)."""
        return f"{self.budget_tag(tenant)}:done:{request_id}"

    @property
    def budget_sweep(self) -> str:
        """Whose turn it is to sweep unsettled reservations (``gateway.accounting.sweep``)."""
        return f"{self.prefix}:budgets:sweep"

    # Per deployment: breaker state, GPU throughput (one hash tag each).

    def breaker(self, deployment: str) -> tuple[str, str, str, str]:
        """A deployment's breaker (``gateway.faults.breaker``): window, open, tripped, probe."""
        base = f"{self.prefix}:{{breaker:{deployment}}}"
        return f"{base}:window", f"{base}:open", f"{base}:tripped", f"{base}:probe"

    def gpu_rate(self, deployment: str, kind: str, suffix: object) -> str:
        """A GPU pool's token or time counter for one period (``gateway.accounting.gpu_rates``)."""
        return f"{self.prefix}:{{gpu:{deployment}}}:{kind}:{suffix}"

    # Single keys and channels (no multi-key operation touches them).

    @property
    def auth_version(self) -> str:
        """Counter of tenant and key changes (``gateway.auth.changes``)."""
        return f"{self.prefix}:auth:version"

    @property
    def auth_channel(self) -> str:
        """Pub/sub channel announcing tenant and key changes."""
        return f"{self.prefix}:auth:changes"

    @property
    def rules_channel(self) -> str:
        """Pub/sub channel announcing applied rule versions (``gateway.rules``)."""
        return f"{self.prefix}:rules:changes"

    def sticky_tier(self, tenant: str, conversation: str) -> str:
        """The tier a conversation's first turn chose (``gateway.rules.sticky``)."""
        return f"{self.prefix}:rules:sticky:{tenant}:{conversation}"
