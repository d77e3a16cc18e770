"""Retry policy for one deployment, built from tenacity's composable pieces.

A ``RetryPolicy`` is a frozen value (from ``RetrySettings`` per tier). ``retrying`` turns it into
a tenacity ``AsyncRetrying`` for one deployment and one request:

- **retry** only backend errors whose ``kind`` is in ``retry_on`` (by default rate limits,
  5xx/overload and connect errors); other retryable errors (timeouts, cut streams, protocol
  errors) move on to the next deployment at once, and rejections stop the chain;
- **wait** the server's ``Retry-After`` when it sent one, else exponential backoff with jitter;
- **stop** after ``max_attempts``, when the ``Retry-After`` is longer than ``retry_after_cap_s``
  (waiting that long is worse than the next deployment), or when the wait would pass the
  request's deadline.

``sleep`` and ``clock`` are injected, so tests never sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_exponential_jitter

from backends.errors import BackendError

__all__ = ["Clock", "RetryPolicy", "Sleep"]

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


def _error(state: RetryCallState) -> BaseException | None:
    return None if state.outcome is None else state.outcome.exception()


class wait_retry_after(wait_base):
    """The server's ``Retry-After`` if the error carries one, else ``fallback``."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = _error(retry_state)
        if isinstance(exc, BackendError) and exc.retry_after is not None:
            return max(0.0, exc.retry_after)
        return self.fallback(retry_state)


class stop_retry_after_over(stop_base):
    """Stop when the server asks for a longer wait than ``cap_s``."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s = cap_s

    def __call__(self, retry_state: RetryCallState) -> bool:
        exc = _error(retry_state)
        return (
            isinstance(exc, BackendError)
            and exc.retry_after is not None
            and exc.retry_after > self.cap_s
        )


class stop_past_deadline(stop_base):
    """Stop when the coming wait (plus a margin for the call) would pass ``deadline``."""

    def __init__(self, deadline: float, clock: Clock, margin_s: float = 0.05) -> None:
        self.deadline = deadline
        self.clock = clock
        self.margin_s = margin_s

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.clock() + retry_state.upcoming_sleep + self.margin_s >= self.deadline


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 2
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0
    jitter_s: float = 0.1
    retry_after_cap_s: float = 5.0
    retry_on: frozenset[str] = frozenset({"rate_limited", "unavailable", "connect_error"})

    def retries(self, exc: BaseException) -> bool:
        return isinstance(exc, BackendError) and exc.retryable and exc.kind in self.retry_on

    def backoff(self) -> wait_base:
        return wait_exponential_jitter(
            multiplier=self.backoff_initial_s, max=self.backoff_max_s, jitter=self.jitter_s
        )

    def retrying(
        self,
        *,
        deadline: float,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.time,
    ) -> AsyncRetrying:
        """Attempts on one deployment; the last error is re-raised as itself."""
        return AsyncRetrying(
            sleep=sleep,
            retry=retry_if_exception(self.retries),
            wait=wait_retry_after(self.backoff()),
            stop=(
                stop_after_attempt(self.max_attempts)
                | stop_retry_after_over(self.retry_after_cap_s)
                | stop_past_deadline(deadline, clock)
            ),
            reraise=True,
        )
