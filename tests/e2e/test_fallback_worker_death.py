"""A worker that dies while it streams: the job is reclaimed by another worker, which must not
start the answer over (the client would see its beginning twice) but end the stream with an
explicit error event; its row books the dead worker's stream. Edge and workers as separate
processes; slow (the reclaim waits for the dead worker's entry to go idle, 15 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support import TEST_KEYS, Proc, Stack
from tests.support.ledger import wait_entry

SMALL = "llama-3.1-8b-instruct"
PROMPT = "Explain how a circuit breaker protects a distributed system, in detail."


@pytest.fixture
def split(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """An edge (``serve --no-workers``) and one worker; the simulator at its real pace (~12 ms
    a token)."""
    with Stack.run(
        tmp_path, redis_url, (SMALL,), time_scale=1.0, edge_only=True, workers=("worker-a",)
    ) as running:
        yield running


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_stream_whose_worker_dies_ends_with_an_error_not_a_repeat(
    split: Stack,
) -> None:
    base_url, database_url = split.base_url, split.database_url
    (first,) = split.workers
    second: Proc | None = None
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
                    second = split.start_worker("worker-b")
    assert finishes == ["error"]  # never a clean end, never the answer started over
    assert len([t for t in text if t]) < 40
    entry = await wait_entry(database_url, request_id, timeout_s=30)
    assert entry.outcome == "stream_error"
    # The dead worker's stream is booked: its mark carried the run's note, with the usage
    # of its first chunk (vLLM's count of the prompt); GPU work, so not flagged.
    (lost,) = entry.attempts
    assert (lost.deployment, lost.outcome, lost.estimated) == (SMALL, "worker_lost", False)
    assert entry.prompt_tokens == lost.prompt_tokens > 0
