"""The background log handler: lines in order, none lost, written at close."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from gateway.observability.logging import BackgroundStreamHandler, JsonFormatter


class SlowStream(io.StringIO):
    """A stream whose writes block until released (a log collector that stalls)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writes = 0

    def write(self, text: str) -> int:
        self.release.wait(5)
        self.writes += 1
        return super().write(text)


def test_a_stalled_stream_does_not_block_the_caller_and_loses_nothing() -> None:
    stream = SlowStream()
    handler = BackgroundStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tiergate.test.background")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for i in range(2000):  # returns at once though the stream is stalled
            logger.warning("line %d", i)
        assert stream.getvalue() == ""
        stream.release.set()
    finally:
        logger.removeHandler(handler)
        handler.close()  # writes what is left
    lines = stream.getvalue().splitlines()
    assert [line.split('"msg":"')[1].split('"')[0] for line in lines] == [
        f"line {i}" for i in range(2000)
    ]
    assert stream.writes < 2000  # batched


def test_lines_emitted_after_close_are_still_written() -> None:
    # logging.config.dictConfig (uvicorn calls it) closes every handler that exists.
    stream = io.StringIO()
    handler = BackgroundStreamHandler(stream)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "after close", None, None)
    handler.close()
    handler.emit(record)
    handler.flush()
    assert stream.getvalue() == "after close\n"
    handler.close()


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_lines_in_quick_succession_cost_one_write_and_a_lone_line_still_goes_out() -> None:
    stream = CountingStream()
    handler = BackgroundStreamHandler(stream, linger_s=0.5)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "line", None, None)
    try:
        for _ in range(200):  # an event loop's access lines: none wakes the writer again
            handler.emit(record)
        deadline = time.monotonic() + 5
        while stream.getvalue().count("line\n") < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.getvalue() == "line\n" * 200  # written without a flush
        assert stream.writes == 1
        handler.emit(record)  # after a quiet spell, one line alone is written too
        while stream.writes < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.getvalue() == "line\n" * 201
    finally:
        handler.close()


def test_flush_does_not_wait_for_the_linger() -> None:
    stream = io.StringIO()
    handler = BackgroundStreamHandler(stream, linger_s=30)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "now", None, None)
    try:
        handler.emit(record)
        started = time.monotonic()
        handler.flush()
        assert stream.getvalue() == "now\n"
        assert time.monotonic() - started < 5
    finally:
        handler.close()


_LOGS_AT_EXIT = """
import logging, sys
from gateway.observability.logging import BackgroundStreamHandler
log = logging.getLogger("late")
log.addHandler(BackgroundStreamHandler(sys.stderr))
class Late:
    def __del__(self) -> None:
        log.error("a line logged at exit")
late = Late()
late.cycle = late  # collected by the interpreter's last collection, after logging.shutdown
del late
"""


def test_a_line_logged_while_the_interpreter_exits_is_written_and_exit_does_not_hang() -> None:
    # ``tiergate serve`` with a port taken hung at exit in CI: a finalizer logged after
    # ``logging.shutdown`` had closed the writer, and a thread started during finalization
    # never starts (Python 3.11 waits for it forever).
    result = subprocess.run(
        [sys.executable, "-c", _LOGS_AT_EXIT],
        capture_output=True, text=True, timeout=20, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "a line logged at exit" in result.stderr
