"""Ctrl-C on ``tiergate up`` stops it in order. The terminal sends SIGINT to the whole
foreground process group: the gateway, its embedded Redis and the simulators. Only the
gateway may act on it: it lets the answer in flight finish and books it, then stops Redis and
the simulators itself. Real processes, as a user at a terminal runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from openai import OpenAI

from tests.support import example_config_on_free_ports, wait_http

pytestmark = pytest.mark.slow


def test_ctrl_c_lets_the_answer_in_flight_finish_and_book_then_stops_quietly(
    tmp_path: Path,
) -> None:
    config, ports = example_config_on_free_ports(tmp_path)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log_file:
        up = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "up", "--config", str(config)],
            cwd=tmp_path, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{ports['gateway']}"
        assert wait_http(f"{base}/readyz", 120), log_path.read_text()
        client = OpenAI(base_url=f"{base}/v1", api_key="dev-acme", max_retries=0)
        first_chunk = threading.Event()
        seen: dict[str, object] = {}

        def call() -> None:
            response = client.chat.completions.with_raw_response.create(
                model="small", stream=True, max_tokens=200,
                messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            )  # fmt: skip
            seen["request_id"] = response.headers["x-request-id"]
            text, finish = [], None
            for chunk in response.parse():
                first_chunk.set()
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
            seen["finish"], seen["chars"] = finish, len("".join(text))

        caller = threading.Thread(target=call)
        caller.start()
        assert first_chunk.wait(60), log_path.read_text()
        os.killpg(up.pid, signal.SIGINT)  # what Ctrl-C does
        caller.join(60)
        assert up.wait(60) == 0, log_path.read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    log = log_path.read_text()
    assert seen.get("finish") in ("stop", "length"), (seen, log)
    assert "ConnectionError" not in log and "Connection refused" not in log, log
    shown = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "ledger", "show", "--config", str(config),
         "--request-id", str(seen["request_id"])],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    row = json.loads(shown.stdout)
    assert (row["status_code"], row["outcome"]) == (200, "ok"), row
    assert row["completion_tokens"] > 0
    time.sleep(0.5)
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not leftovers, leftovers  # no simulator or redis-server left running
