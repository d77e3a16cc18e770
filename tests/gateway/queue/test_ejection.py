"""Outlier ejection of one replica, on an injected clock: failures in a row eject it, a cool-down
(doubling on each ejection in a row, to a cap) ends in one trial call, whose verdict closes it or
ejects it again; a success resets the count; the last usable replica is never ejected."""

from __future__ import annotations

import pytest

from gateway.queue.replicas.ejection import EjectionPolicy, Ejections

DEP = "llama"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _ejections(clock: Clock, ejected: list[str] | None = None, after: int = 3) -> Ejections:
    sink = ejected if ejected is not None else []
    return Ejections(
        EjectionPolicy(after=after, base_s=10.0, max_s=35.0), clock=clock, on_eject=sink.append
    )


def test_failures_in_a_row_eject_for_the_cool_down(clock: Clock) -> None:
    ejected: list[str] = []
    e = _ejections(clock, ejected)
    for _ in range(2):
        e.failed(DEP, "a")
    assert e.usable(DEP, "a")
    e.failed(DEP, "a")
    assert not e.usable(DEP, "a") and e.ejected(DEP, "a")
    assert ejected == [DEP]
    clock.now += 9.9
    assert not e.usable(DEP, "a")
    clock.now += 0.1
    assert e.usable(DEP, "a")  # due its trial
    assert e.usable(DEP, "b")  # others untouched


def test_a_success_resets_the_count(clock: Clock) -> None:
    e = _ejections(clock)
    e.failed(DEP, "a")
    e.failed(DEP, "a")
    e.succeeded(DEP, "a")
    e.failed(DEP, "a")
    e.failed(DEP, "a")
    assert e.usable(DEP, "a")


def test_one_trial_at_a_time_and_its_verdict(clock: Clock) -> None:
    ejected: list[str] = []
    e = _ejections(clock, ejected)
    for _ in range(3):
        e.failed(DEP, "a")
    clock.now += 10
    e.chosen(DEP, "a", "w:1")
    assert not e.usable(DEP, "a")  # its trial is in flight: no second one
    e.failed(DEP, "a")  # the trial failed: out again, for twice as long
    assert ejected == [DEP, DEP]
    clock.now += 19.9
    assert not e.usable(DEP, "a")
    clock.now += 0.1
    e.chosen(DEP, "a", "w:2")
    e.failed(DEP, "a")
    clock.now += 35  # the cap, not 40
    assert e.usable(DEP, "a")
    e.chosen(DEP, "a", "w:3")
    e.succeeded(DEP, "a")  # closed: the doubling starts over
    assert e.usable(DEP, "a") and not e.ejected(DEP, "a")
    for _ in range(3):
        e.failed(DEP, "a")
    clock.now += 10
    assert e.usable(DEP, "a")


def test_a_trial_given_back_or_without_verdict_lets_another_try(clock: Clock) -> None:
    e = _ejections(clock)
    for _ in range(3):
        e.failed(DEP, "a")
    clock.now += 10
    e.chosen(DEP, "a", "w:1")
    e.unchosen(DEP, "a", "w:0")  # another lease's slot: the trial stands
    assert not e.usable(DEP, "a")
    e.unchosen(DEP, "a", "w:1")  # given back with no call
    assert e.usable(DEP, "a")
    e.chosen(DEP, "a", "w:2")
    e.no_verdict(DEP, "a")  # cancelled, or the request's own fault
    assert e.usable(DEP, "a") and e.ejected(DEP, "a")


def test_a_late_failure_of_a_call_chosen_before_does_not_extend(clock: Clock) -> None:
    ejected: list[str] = []
    e = _ejections(clock, ejected)
    for _ in range(4):
        e.failed(DEP, "a")
    assert ejected == [DEP]
    clock.now += 10
    assert e.usable(DEP, "a")


def test_the_last_usable_replica_stays_in(clock: Clock) -> None:
    ejected: list[str] = []
    e = _ejections(clock, ejected)
    for _ in range(5):
        e.failed(DEP, "a", last=True)
    assert e.usable(DEP, "a") and ejected == []


def test_zero_never_ejects(clock: Clock) -> None:
    e = _ejections(clock, after=0)
    for _ in range(10):
        e.failed(DEP, "a")
    assert e.usable(DEP, "a")


# (what happened before, after-count of the policy, last usable replica?) -> breaker told?
BREAKER_TOLD = [
    pytest.param(0, 3, False, False, id="first failure, others usable: the replica's"),
    pytest.param(2, 3, False, False, id="the ejecting failure: the replica's"),
    pytest.param(3, 3, False, False, id="a late failure while ejected: the replica's"),
    pytest.param(0, 3, True, True, id="first failure of the last usable: the breaker's"),
    pytest.param(2, 3, True, True, id="third failure of the last usable: the breaker's"),
    pytest.param(0, 0, False, True, id="ejection off: the breaker's"),
]


@pytest.mark.parametrize(("before", "after", "last", "told"), BREAKER_TOLD)
def test_a_failure_is_the_replicas_or_the_breakers_never_both(
    clock: Clock, before: int, after: int, last: bool, told: bool
) -> None:
    e = _ejections(clock, after=after)
    for _ in range(before):
        e.failed(DEP, "a")
    assert e.failed(DEP, "a", last=last) is told


def test_a_failed_trial_is_the_replicas(clock: Clock) -> None:
    e = _ejections(clock)
    for _ in range(3):
        e.failed(DEP, "a")
    clock.now += 10.0
    e.chosen(DEP, "a", "lease-1")
    assert e.failed(DEP, "a") is False  # ejected again, for 20 s
    assert not e.usable(DEP, "a")
