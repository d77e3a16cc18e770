"""``again``: a call tried again under a tenacity policy after its first try failed; the failed
first try is tenacity's attempt 1 (so the waits and the stop read as around the whole call),
and a first error the policy does not retry is raised at once (an injected sleep: no test
sleeps)."""

from __future__ import annotations

import pytest
from tenacity import retry_if_exception_type, stop_after_attempt, wait_chain, wait_fixed

from gateway.retrying import again

WAIT = wait_chain(wait_fixed(0.01), wait_fixed(0.05), wait_fixed(0.2))


class Flaky:
    """Fails its first ``failures`` calls with ``error``, then answers its call count."""

    def __init__(self, failures: int, error: type[Exception] = OSError) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"failure {self.calls}")
        return self.calls


# (later calls that fail, attempts allowed in all) -> (calls made again, pauses, outcome)
CASES = [
    pytest.param(0, 4, 1, [0.01], 1, id="answers at the second attempt"),
    pytest.param(2, 4, 3, [0.01, 0.05, 0.2], 3, id="answers at the fourth"),
    pytest.param(3, 4, 3, [0.01, 0.05, 0.2], None, id="stops after four: the last error"),
]


@pytest.mark.parametrize(("failures", "attempts", "calls", "pauses", "answer"), CASES)
async def test_the_failed_first_try_counts_as_attempt_one(
    failures: int, attempts: int, calls: int, pauses: list[float], answer: int | None
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    call = Flaky(failures)

    async def run() -> int:
        return await again(
            call,
            OSError("the first try"),
            retry=retry_if_exception_type(OSError),
            stop=stop_after_attempt(attempts),
            wait=WAIT,
            sleep=sleep,
        )

    if answer is None:
        with pytest.raises(OSError, match=f"failure {failures}"):
            await run()
    else:
        assert await run() == answer
    assert call.calls == calls
    assert slept == pauses


async def test_a_first_error_the_policy_does_not_retry_is_raised_at_once() -> None:
    call = Flaky(0)
    with pytest.raises(KeyError):
        await again(
            call, KeyError("not retried"), retry=retry_if_exception_type(OSError), wait=WAIT
        )
    assert call.calls == 0
