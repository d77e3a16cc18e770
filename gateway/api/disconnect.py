"""Noticing that a client went away while its request waits for the first reply.

Once the body is read, the ASGI server's ``receive`` returns only when the client disconnects
(``http.disconnect``). Waiting on it beside the first reply tells the two apart; a response
that is streaming notices the disconnect through the server instead (the stream is cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

from fastapi import Request

__all__ = ["first_unless_gone"]

T = TypeVar("T")


async def _gone(request: Request) -> None:
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


async def first_unless_gone(request: Request, items: AsyncIterator[T]) -> T | None:
    """The first item of ``items``, or ``None`` when the client disconnects before it."""
    first = asyncio.ensure_future(anext(items))
    gone = asyncio.ensure_future(_gone(request))
    try:
        await asyncio.wait((first, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        first.cancel()
        raise
    finally:
        if not gone.done():
            gone.cancel()
    if first.done():
        return first.result()
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await first
    return None
