"""Outlier ejection: a replica that keeps failing is left out of its deployment for a while.

Each replica of a deployment counts its backend-caused failures in a row (the failures the
deployment's circuit breaker is told of: retryable, not cut by the request's own deadline;
``gateway.queue.running.attempts``). After ``after`` in a row it is *ejected*: the pool chooses
it for no call for a cool-down of ``base_s``, doubled for each ejection in a row up to ``max_s``.
Once the cool-down is over it gets one trial call (half-open): a success closes it (and resets
the doubling), a failure ejects it again; a call that ends with no verdict (cancelled, the
request's own fault) lets another call be its trial, and so does a trial that has not reported
within ``max_s`` (a lost task). A success resets the count. The pool never ejects a
deployment's last usable replica (``failed(..., last=True)``).

A failure is either the replica's or the deployment's to answer for, never both: while other
replicas are usable, ejection answers for it and the deployment's breaker is not told (three
failures of one bad pod of three, against a success or two in a quiet window, would otherwise
be over the breaker's ratio and close the whole deployment). The breaker hears the failures of
the last usable replica (every other one is out), and every failure when ejection is off.

State is per process, like Envoy's outlier detection is per proxy: the deployment-wide breaker
(``gateway.faults.breaker``) is the one shared through Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["EjectionPolicy", "Ejections", "OnEject", "ReplicaHealth"]

log = logging.getLogger(__name__)

OnEject = Callable[[str], None]
"""Told the deployment of a replica each time one is ejected (a metric)."""


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    after: int = 3
    """Backend-caused failures in a row that eject a replica; 0: never ejected."""
    base_s: float = 10.0
    max_s: float = 300.0

    def cool_down(self, ejections: int) -> float:
        """The cool-down of the ``ejections``-th ejection in a row (1-based)."""
        return min(self.base_s * float(2 ** max(ejections - 1, 0)), self.max_s)


@dataclass(slots=True)
class ReplicaHealth:
    """One replica's ejection state (``failures`` in a row; ejected ``until`` a time)."""

    failures: int = 0
    ejections: int = 0
    until: float | None = None
    trial_since: float | None = None
    """When its trial call was chosen; ``None``: no trial in flight."""
    trial_lease: str | None = None

    def usable(self, now: float, trial_timeout_s: float) -> bool:
        if self.until is None:
            return True
        if now < self.until:
            return False
        return self.trial_since is None or now - self.trial_since >= trial_timeout_s


class Ejections:
    """Every replica's ``ReplicaHealth`` in this process, by deployment and replica name."""

    def __init__(
        self,
        policy: EjectionPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_eject: OnEject | None = None,
    ) -> None:
        self.policy = policy or EjectionPolicy()
        self.clock = clock
        self.on_eject = on_eject
        self._health: dict[tuple[str, str], ReplicaHealth] = {}

    def _of(self, deployment: str, replica: str) -> ReplicaHealth:
        return self._health.setdefault((deployment, replica), ReplicaHealth())

    @property
    def _trial_timeout_s(self) -> float:
        return self.policy.max_s  # a trial that never reported (a lost task) is retried

    def usable(self, deployment: str, replica: str) -> bool:
        """Whether the pool may choose ``replica`` now (closed, or due a trial)."""
        health = self._health.get((deployment, replica))
        return health is None or health.usable(self.clock(), self._trial_timeout_s)

    def ejected(self, deployment: str, replica: str) -> bool:
        health = self._health.get((deployment, replica))
        return health is not None and health.until is not None

    def chosen(self, deployment: str, replica: str, lease_id: str) -> None:
        """A slot (``lease_id``) was taken on ``replica``: its trial, if one is due."""
        health = self._health.get((deployment, replica))
        if health is not None and health.until is not None and self.clock() >= health.until:
            health.trial_since = self.clock()
            health.trial_lease = lease_id

    def unchosen(self, deployment: str, replica: str, lease_id: str) -> None:
        """A slot taken on ``replica`` was given back with no call made on it."""
        health = self._health.get((deployment, replica))
        if health is not None and health.trial_lease == lease_id:
            health.trial_since = health.trial_lease = None

    def succeeded(self, deployment: str, replica: str) -> None:
        health = self._health.get((deployment, replica))
        if health is not None and health.until is not None:
            log.info("replica %s of %s answered its trial: back in", replica, deployment)
        self._health.pop((deployment, replica), None)

    def no_verdict(self, deployment: str, replica: str) -> None:
        """A call on ``replica`` ended neither answered nor failed by the backend."""
        health = self._health.get((deployment, replica))
        if health is not None:
            health.trial_since = health.trial_lease = None

    def failed(self, deployment: str, replica: str, *, last: bool = False) -> bool:
        """A backend-caused failure on ``replica``; ejects it at the policy's count, or at
        once when it failed its trial. ``last``: no other replica of the deployment is
        usable: it stays in (counted), and the deployment's breaker judges the deployment.
        Whether the breaker is to be told (``last``, or ejection off)."""
        if self.policy.after <= 0:
            return True
        health = self._of(deployment, replica)
        health.failures += 1
        now = self.clock()
        on_trial = health.until is not None and now >= health.until
        if not on_trial and (health.until is not None or health.failures < self.policy.after):
            return last  # counting, or a call chosen before the ejection failed late
        if last:
            health.until = health.trial_since = None
            return True
        health.ejections += 1
        cool_down = self.policy.cool_down(health.ejections)
        health.until = now + cool_down
        health.trial_since = health.trial_lease = None
        log.warning(
            "replica %s of %s ejected for %.1f s after %d failures in a row (ejection %d)",
            replica, deployment, cool_down, health.failures, health.ejections,
        )  # fmt: skip
        if self.on_eject is not None:
            self.on_eject(deployment)
        return False

    def forget(self, deployment: str, replica: str) -> None:
        """``replica`` left the deployment."""
        self._health.pop((deployment, replica), None)
