"""The edge's limit on a silent stream: no reply for ``limits.sse_idle_s`` ends it.

Backends' own stall timeouts normally end a silent stream first (and may fall back); this is
the edge's backstop, for a worker that vanished mid-stream or a chain of slow fallbacks, so a
client never holds an open stream that says nothing. The relay turns the error into a final
chunk with ``finish_reason: "error"`` and an error event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from gateway.errors import DeadlineExceeded

__all__ = ["idle_limited"]

T = TypeVar("T")


async def idle_limited(items: AsyncIterator[T], idle_s: float) -> AsyncIterator[T]:
    while True:
        try:
            async with asyncio.timeout(idle_s):  # no task per item, unlike wait_for
                item = await anext(items)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise DeadlineExceeded(
                f"the stream sent nothing for {idle_s:g} s", code="stream_idle"
            ) from None
        yield item
