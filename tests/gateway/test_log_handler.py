"""The background log handler: lines in order, none lost, written at close."""

from __future__ import annotations

import io
import logging
import threading

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
