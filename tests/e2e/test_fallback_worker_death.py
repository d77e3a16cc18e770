"""A worker that dies while it streams: the job is reclaimed by another worker, which must not
start the answer over (the client would see its beginning twice) but end the stream with an
explicit error event; its row books the dead worker's stream. Edge and workers as separate
processes; slow (the reclaim waits for the dead worker's entry to go idle, 15 s)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis
import yaml

from tests.e2e.ledger import wait_entry
from tests.support import (
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)

SMALL = "llama-3.1-8b-instruct"
PROMPT = "Explain how a circuit breaker protects a distributed system, in detail."


def start_worker(config: Path, workdir: Path, name: str) -> Proc:
    """A worker process with a config of its own (its own admin port)."""
    own = workdir / name
    own.mkdir()
    data = yaml.safe_load(config.read_text())
    data["server"]["admin_port"] = free_port()
    path = own / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    args = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(path)]
    return Proc(args, workdir / f"{name}.log", TEST_KEYS)


@pytest.fixture
def split(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, str, Path, Path, Proc]]:
    prefix = f"tgtest-{uuid.uuid4().hex[:10]}"
    port, admin, sim_port = free_port(), free_port(), free_port()
    sim, _ = start_sim(SMALL, sim_port, tmp_path, time_scale=1.0)  # real pace: ~12 ms a token
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    config = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=prefix,
        database_url=database_url,
        sim_ports={SMALL: sim_port},
        port=port,
        admin_port=admin,
    )
    edge = start_gateway(config, tmp_path, "--no-workers")
    first = start_worker(config, tmp_path, "worker-a")
    try:
        wait_ready(edge, f"http://127.0.0.1:{port}/readyz")
        yield f"http://127.0.0.1:{port}", database_url, config, tmp_path, first
    finally:
        first.stop()
        edge.stop()
        sim.stop()
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_stream_whose_worker_dies_ends_with_an_error_not_a_repeat(
    split: tuple[str, str, Path, Path, Proc],
) -> None:
    base_url, database_url, config, workdir, first = split
    second: Proc | None = None
    try:
        async with openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key=TEST_KEYS["TIERGATE_KEY_ACME"], max_retries=0
        ) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=SMALL,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=2000,
                stream=True,
                extra_headers={"x-tiergate-timeout-ms": "90000"},
            )
            request_id = raw.headers["x-request-id"]
            text: list[str] = []
            finishes: list[str] = []
            with pytest.raises(openai.APIError):
                async for chunk in raw.parse():
                    for choice in chunk.choices:
                        text.append(choice.delta.content or "")
                        if choice.finish_reason:
                            finishes.append(choice.finish_reason)
                    if len(text) == 10 and second is None:
                        first.popen.kill()  # the worker dies mid-stream
                        first.popen.wait()
                        second = start_worker(config, workdir, "worker-b")
        assert finishes == ["error"]  # never a clean end, never the answer started over
        assert len([t for t in text if t]) < 40
        entry = await wait_entry(database_url, request_id, timeout_s=30)
        assert entry.outcome == "stream_error"
        # The dead worker's stream is booked: its mark carried the run's note, with the usage
        # of its first chunk (vLLM's count of the prompt); GPU work, so not flagged.
        (lost,) = entry.attempts
        assert (lost.deployment, lost.outcome, lost.estimated) == (SMALL, "worker_lost", False)
        assert entry.prompt_tokens == lost.prompt_tokens > 0
    finally:
        first.stop()
        if second is not None:
            second.stop()
