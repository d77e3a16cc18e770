"""In-process checks of the observability helpers: the JSON log formatter and request ids, the
access line's prompt rule, and the metric helpers other parts call (fast; default suite)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from gateway.metrics import Metrics
from gateway.observability.logging import (
    JsonFormatter,
    bind_request_id,
    configure_logging,
    log_request,
    request_id_var,
)
from gateway.settings import load_settings
from tests.deploy.conftest import DEPLOY


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stream = io.StringIO()
    configure_logging(logging.INFO, fmt="json", stream=stream)
    yield stream
    root.handlers[0].close()
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    logging.getLogger().handlers[0].flush()  # written in the background
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_request_id_follows_the_request_into_its_tasks(captured: io.StringIO) -> None:
    async def handle(request_id: str) -> None:
        bind_request_id(request_id)
        await asyncio.sleep(0)
        await asyncio.create_task(asyncio.to_thread(lambda: None))
        logging.getLogger("tiergate.test").info("working")

    await asyncio.gather(handle("req_a"), handle("req_b"))
    assert sorted(line["request_id"] for line in _lines(captured)) == ["req_a", "req_b"]
    assert request_id_var.get() is None  # each task had its own context


def test_access_line_fields_and_prompt_only_when_passed(captured: io.StringIO) -> None:
    log_request({"request_id": "req_1", "tenant": "acme", "outcome": "ok", "cost_usd": None})
    log_request({"request_id": "req_2", "tenant": "acme"}, prompt=[{"role": "user"}])
    first, second = _lines(captured)
    assert first["logger"] == "tiergate.access" and first["msg"] == "request"
    assert first["request_id"] == "req_1" and first["cost_usd"] is None
    assert "prompt" not in first
    assert second["prompt"] == [{"role": "user"}]
    assert {"ts", "level", "logger", "msg"} <= set(first)


def test_exceptions_are_one_json_line() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom %s", ("now",), None)
    try:
        raise RuntimeError("inner")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["msg"] == "boom now" and "RuntimeError: inner" in data["exc"]


def test_breaker_and_attempt_helpers_export_series() -> None:
    metrics = Metrics()
    metrics.declare_deployments(["a", "b"])
    metrics.set_breaker("b", "open")
    metrics.observe_attempts([("a", "ok"), ("a", "timeout"), ("a", "ok")])
    text = generate_latest(metrics.registry).decode()
    assert 'tiergate_breaker_state{deployment="a"} 0.0' in text
    assert 'tiergate_breaker_state{deployment="b"} 2.0' in text
    assert 'tiergate_backend_attempts_total{deployment="a",outcome="ok"} 2.0' in text
    with pytest.raises(KeyError):
        metrics.set_breaker("a", "ajar")


def test_logging_settings_default_to_json_without_prompts() -> None:
    settings = load_settings(DEPLOY / "config.example.yaml")
    assert settings.logging.format == "json" and settings.logging.log_prompts is False
