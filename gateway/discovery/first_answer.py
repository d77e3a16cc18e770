"""``FirstAnswer``: whether a discovery source has had its first list of pods, which a process
waits for a few seconds at start-up (``gateway.discovery.wiring.start_discovery``), so that it
routes to the pods at once."""

from __future__ import annotations

import asyncio

__all__ = ["FirstAnswer"]


class FirstAnswer:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        """The source has its first list (later ones change nothing)."""
        self._event.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the first list is in (``False``: not within ``timeout_s``)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
