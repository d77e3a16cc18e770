"""Background loops: one helper instead of a hand-written ``while True`` in every class.

    self._loop = Loop("breaker-watch", self.refresh, every_s=1.0, catch=(Exception,),
                      on_error=lambda exc: log.error("breaker refresh failed", exc_info=exc))
    self._loop.start()          # at start-up
    await self._loop.aclose()   # at shutdown (``gateway.tasks.stop_task``)

A ``Loop`` calls ``step`` over and over in a task of its own, and sleeps ``every_s`` after each
call (a fixed delay, as the loops it replaced; with ``pause_first`` also before the first; a
pause of 0 goes straight on to the next step, for a step that blocks on a read itself). An
error of ``catch`` goes to ``on_error`` and the loop goes on; any other error ends the loop, as
it ended the loops this replaced. With ``backoff`` (a tenacity wait, e.g.
``wait_exponential(0.05, max=1.0)``), a failed step is tried again after the backoff's pauses,
growing with each failure, until one succeeds; then the loop carries on as before and the
backoff starts over. Steps that succeed pay no tenacity machinery (the reply reader runs a step
per batch of replies). ``sleep`` is injected, so tests never sleep.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tenacity import RetryCallState, retry_if_exception_type
from tenacity.wait import wait_base

from gateway.retrying import again
from gateway.tasks import stop_task

__all__ = ["Loop", "Sleep"]

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


def _log_error(exc: BaseException) -> None:
    log.error("background step failed", exc_info=exc)


class Loop:
    __slots__ = (
        "_backoff",
        "_catch",
        "_every_s",
        "_name",
        "_on_error",
        "_pause_first",
        "_sleep",
        "_step",
        "_task",
    )

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        *,
        every_s: float | Callable[[], float],
        catch: tuple[type[BaseException], ...] = (),
        on_error: Callable[[BaseException], None] = _log_error,
        pause_first: bool = False,
        backoff: wait_base | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """``every_s``: seconds between steps, or a callable read before each pause (a setting
        that may change). ``catch``: the errors a step may raise without ending the loop."""
        self._name = name
        self._step = step
        self._every_s = every_s
        self._catch = catch
        self._on_error = on_error
        self._pause_first = pause_first
        self._backoff = backoff
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        """The name of its task."""
        return self._name

    @property
    def started(self) -> bool:
        """Started and not closed since."""
        return self._task is not None

    def start(self) -> None:
        """Run the loop in a task named after it (once; a second call changes nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=self._name)

    async def aclose(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def run(self) -> None:
        """The loop itself, in the caller's task (``start`` runs it in a task of its own)."""
        if self._pause_first:
            await self._pause()
        while True:
            await self.step_once()
            await self._pause()

    async def step_once(self) -> None:
        """One step, its error (of ``catch``) handed to ``on_error``; with ``backoff``, tried
        again after growing pauses until it succeeds."""
        try:
            await self._step()
        except self._catch as exc:
            if self._backoff is None:
                self._on_error(exc)
            else:
                await self._recover(exc)

    async def _recover(self, failed: BaseException) -> None:
        assert self._backoff is not None
        await again(
            self._step,
            failed,
            retry=retry_if_exception_type(self._catch),
            wait=self._backoff,
            before_sleep=self._before_pause,
            sleep=self._sleep,
        )

    def _before_pause(self, state: RetryCallState) -> None:
        exc = None if state.outcome is None else state.outcome.exception()
        if exc is not None:
            self._on_error(exc)

    async def _pause(self) -> None:
        every = self._every_s
        seconds = every() if callable(every) else every
        if seconds > 0:
            await self._sleep(seconds)
