"""InflightCalls: a drain ends the calls waiting on that deployment, and only those."""

from __future__ import annotations

import asyncio

import pytest

from backends.errors import BackendUnavailable
from gateway.faults.drain import InflightCalls


async def test_drain_ends_the_calls_on_that_deployment_only() -> None:
    calls = InflightCalls()
    cancelled: list[str] = []

    async def call(deployment: str) -> str:
        async with calls.watching(deployment):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(deployment)  # the HTTP request is aborted, as vLLM expects
                raise
        return "answered"

    small = [asyncio.create_task(call("small")) for _ in range(3)]
    large = asyncio.create_task(call("large"))
    await asyncio.sleep(0.01)
    assert calls.drain("small") == 3
    for task in small:
        with pytest.raises(BackendUnavailable) as caught:
            await asyncio.wait_for(task, timeout=1)
        assert caught.value.retryable and caught.value.backend == "small"
    assert cancelled == ["small"] * 3
    assert not large.done()
    assert calls.drain("small") == 0  # nothing waits there any more
    large.cancel()


async def test_a_finished_call_is_not_drained_and_its_own_timeout_stays_a_timeout() -> None:
    calls = InflightCalls()
    async with calls.watching("small"):
        pass
    assert calls.drain("small") == 0
    with pytest.raises(TimeoutError):
        async with calls.watching("small"), asyncio.timeout(0.01):
            await asyncio.sleep(1)


async def test_draining_twice_before_the_call_has_ended_is_harmless() -> None:
    calls = InflightCalls()

    async def call() -> None:
        async with calls.watching("small"):
            await asyncio.sleep(30)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.01)
    assert calls.drain("small") == 1
    assert calls.drain("small") == 1  # the next check, before the call has ended: no error
    with pytest.raises(BackendUnavailable):
        await task
    assert calls.drain("small") == 0
