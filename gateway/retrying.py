"""Tenacity after a failed first try: ``again`` tries a call again under a tenacity policy,
once its first try (made plainly by the caller) has raised.

    try:
        await send()                      # as a rule it succeeds: no tenacity machinery
    except (RedisError, OSError) as failed:
        await again(send, failed, retry=..., stop=..., wait=...)

An ``AsyncRetrying`` around a trivial await costs about 30 us a call here against 0.2 us for
the await alone; on a path every reply or every job takes, that is paid on each. The failed
first try counts as tenacity's attempt 1, so ``stop`` and ``wait`` read as they would around
the whole call. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, stop_never
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

__all__ = ["again"]

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]


async def again(
    call: Callable[[], Awaitable[T]],
    failed: BaseException,
    *,
    retry: retry_base,
    stop: stop_base | Callable[[RetryCallState], bool] = stop_never,
    wait: wait_base,
    before_sleep: Callable[[RetryCallState], Any] | None = None,
    sleep: Sleep = asyncio.sleep,
) -> T:
    """``call()`` tried again after ``failed`` (its first try's error) as tenacity's policy
    says; the last error is raised when it stops (``reraise``)."""
    pending = [failed]
    retrying = AsyncRetrying(
        retry=retry, stop=stop, wait=wait, sleep=sleep, reraise=True, before_sleep=before_sleep
    )
    async for attempt in retrying:
        with attempt:
            if pending:
                raise pending.pop()
            return await call()
    raise AssertionError("unreachable")  # reraise=True: tenacity raised the last error
