"""Waiting in tests for something that happens elsewhere (another task, process or server).

One home for the loop "check, sleep a little, give up at a deadline": ``until`` for a condition
(sync or async) in async tests, ``value_when`` for a value read until it is the one awaited,
``wait_until`` for sync tests. Each fails with ``AssertionError`` naming what never happened,
and returns as soon as the condition holds (the time waited, where a test measures it).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["until", "value_when", "wait_until"]

T = TypeVar("T")


async def until(
    predicate: Callable[[], object],
    timeout_s: float = 10.0,
    *,
    what: str = "condition not reached",
    every_s: float = 0.02,
) -> float:
    """Wait until ``predicate()`` is true (awaited if it returns an awaitable); the seconds it
    took. Checked at once, then every ``every_s``; ``AssertionError(what)`` after ``timeout_s``."""
    started = time.monotonic()
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what} (after {timeout_s}s)")
        await asyncio.sleep(every_s)


async def value_when(
    read: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    timeout_s: float = 10.0,
    *,
    what: str = "value never accepted",
    every_s: float = 0.05,
) -> T:
    """``await read()`` until ``accept`` takes its value, and return that value; the last value
    read is in the ``AssertionError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await read()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (after {timeout_s}s; last: {value!r})")
        await asyncio.sleep(every_s)


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float = 10.0,
    *,
    what: str = "condition not reached",
    every_s: float = 0.05,
) -> float:
    """``until`` for sync tests (blocks the thread between checks)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what} (after {timeout_s}s)")
        time.sleep(every_s)
    return time.monotonic() - started
