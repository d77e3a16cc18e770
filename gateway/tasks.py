"""Stopping background tasks for real.

A single ``task.cancel()`` is not always enough: a client library that catches the
``CancelledError`` inside one of its calls (redis-py does in some paths) lets a ``while True``
loop carry on, and ``await task`` then waits forever. ``stop_task`` repeats the cancellation
until the task has ended, within a bound, so shutdown always finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

__all__ = ["stop_task", "stop_tasks"]

log = logging.getLogger(__name__)


async def stop_task(task: asyncio.Task[object] | None, *, timeout_s: float = 5.0) -> None:
    """Cancel ``task`` and wait until it has ended, re-cancelling if a cancel was swallowed."""
    if task is None or task.done():
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
        if loop.time() > deadline:
            log.error("background task %s did not stop within %.1fs", task.get_name(), timeout_s)
            return
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


async def stop_tasks(tasks: Iterable[asyncio.Task[object]], *, timeout_s: float = 5.0) -> None:
    await asyncio.gather(*(stop_task(t, timeout_s=timeout_s) for t in tasks))
