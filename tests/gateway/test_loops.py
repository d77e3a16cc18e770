"""``Loop``: the one background-loop helper; every pause goes through the injected sleep, so
these tests never sleep."""

from __future__ import annotations

import asyncio

import pytest
from tenacity import wait_exponential

from gateway.loops import Loop


class Stop(Exception):
    """Ends a loop from its sleep, after the pauses a test wants to see."""


class Script:
    """A step that fails with the given errors in turn (``None``: succeeds), and a sleep that
    records each pause and stops the loop after ``pauses`` of them."""

    def __init__(self, outcomes: list[BaseException | None], pauses: int) -> None:
        self.outcomes = list(outcomes)
        self.events: list[str | float] = []
        self.errors: list[BaseException] = []
        self.limit = pauses

    async def step(self) -> None:
        outcome = self.outcomes.pop(0) if self.outcomes else None
        self.events.append("fail" if outcome else "step")
        if outcome is not None:
            raise outcome

    async def sleep(self, seconds: float) -> None:
        self.events.append(seconds)
        if sum(isinstance(e, float) for e in self.events) >= self.limit:
            raise Stop

    def loop(self, **kwargs: object) -> Loop:
        return Loop("test", self.step, sleep=self.sleep, on_error=self.errors.append, **kwargs)  # type: ignore[arg-type]


async def test_a_fixed_delay_after_each_step() -> None:
    script = Script([], pauses=3)
    with pytest.raises(Stop):
        await script.loop(every_s=0.5).run()
    assert script.events == ["step", 0.5, "step", 0.5, "step", 0.5]


async def test_pause_first_and_a_pause_read_each_time() -> None:
    script = Script([], pauses=3)
    every = iter([1.0, 2.0, 3.0])
    with pytest.raises(Stop):
        await script.loop(every_s=lambda: next(every), pause_first=True).run()
    assert script.events == [1.0, "step", 2.0, "step", 3.0]


async def test_caught_errors_are_reported_and_the_loop_goes_on() -> None:
    script = Script([OSError("a"), None, OSError("b")], pauses=3)
    with pytest.raises(Stop):
        await script.loop(every_s=1.0, catch=(OSError,)).run()
    assert script.events == ["fail", 1.0, "step", 1.0, "fail", 1.0]
    assert [str(e) for e in script.errors] == ["a", "b"]


async def test_an_error_not_caught_ends_the_loop() -> None:
    script = Script([KeyError("bug")], pauses=9)
    with pytest.raises(KeyError):
        await script.loop(every_s=1.0, catch=(OSError,)).run()
    assert script.events == ["fail"] and script.errors == []


async def test_backoff_grows_until_a_step_succeeds_then_starts_over() -> None:
    script = Script([*[OSError("x")] * 4, None, OSError("y")], pauses=5)
    loop = script.loop(
        every_s=0, catch=(OSError,), backoff=wait_exponential(multiplier=0.05, max=0.2)
    )
    with pytest.raises(Stop):
        await loop.run()
    # every_s=0: no pause after a step that succeeds; the backoff doubles up to its maximum
    assert script.events == [
        *("fail", 0.05, "fail", 0.1, "fail", 0.2, "fail", 0.2),
        *("step", "fail", 0.05),
    ]
    assert [str(e) for e in script.errors] == ["x"] * 4 + ["y"]


async def test_start_runs_one_task_and_aclose_stops_it() -> None:
    ticks: list[int] = []
    three = asyncio.Event()

    async def step() -> None:
        ticks.append(1)
        if len(ticks) >= 3:
            three.set()

    loop = Loop("tick", step, every_s=0.001)
    loop.start()
    loop.start()
    assert loop.started
    await asyncio.wait_for(three.wait(), timeout=5)
    named = [t for t in asyncio.all_tasks() if t.get_name() == "tick"]
    assert len(named) == 1
    await loop.aclose()
    assert not loop.started and named[0].done()
