"""The retry policy: which errors retry, how long it waits, when it stops (no real sleeping)."""

from __future__ import annotations

import pytest

from backends.errors import (
    BackendConnectError,
    BackendError,
    BackendRateLimited,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
)
from gateway.faults.policy import RetryPolicy


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def run(policy: RetryPolicy, errors: list[BackendError | None], *, deadline: float = 2000.0):
    t = FakeTime()
    calls = 0
    result: str | BackendError = "unset"
    try:
        async for attempt in policy.retrying(deadline=deadline, sleep=t.sleep, clock=t.clock):
            with attempt:
                error = errors[calls]
                calls += 1
                if error is not None:
                    raise error
                result = "ok"
    except BackendError as exc:
        result = exc
    return result, calls, t.slept


async def test_retry_after_is_honoured() -> None:
    result, calls, slept = await run(
        RetryPolicy(max_attempts=3), [BackendRateLimited("slow down", retry_after=1.5), None]
    )
    assert result == "ok" and calls == 2 and slept == [1.5]


async def test_retry_after_over_the_cap_moves_on_at_once() -> None:
    error = BackendRateLimited("slow down", retry_after=30)
    result, calls, slept = await run(RetryPolicy(max_attempts=3, retry_after_cap_s=5), [error])
    assert result is error and calls == 1 and slept == []


async def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    policy = RetryPolicy(max_attempts=4, backoff_initial_s=0.1, backoff_max_s=10, jitter_s=0.05)
    errors: list[BackendError | None] = [BackendUnavailable("503")] * 3 + [None]
    result, calls, slept = await run(policy, errors)
    assert result == "ok" and calls == 4
    for wait, base in zip(slept, (0.1, 0.2, 0.4), strict=True):
        assert base <= wait <= base + 0.05


async def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    errors: list[BackendError | None] = [BackendConnectError("refused")] * 5
    result, calls, _ = await run(RetryPolicy(max_attempts=2), errors)
    assert isinstance(result, BackendConnectError) and calls == 2


@pytest.mark.parametrize(
    "error", [BackendTimeout("slow"), BackendRejected("bad request", status=400)]
)
async def test_timeouts_and_rejections_are_not_retried_in_place(error: BackendError) -> None:
    result, calls, slept = await run(RetryPolicy(max_attempts=5), [error, None])
    assert result is error and calls == 1 and slept == []


async def test_a_wait_past_the_deadline_stops() -> None:
    error = BackendRateLimited("slow down", retry_after=2)
    result, calls, slept = await run(RetryPolicy(max_attempts=5), [error, None], deadline=1001.0)
    assert result is error and calls == 1 and slept == []
