"""The prefix cache through the simulator's HTTP API: hits on a repeated prompt and on a
conversation's next turn, vLLM's counters and cache info, a shorter time to first token, and the
switch that turns it off (profile and ``tiergate sim`` flag)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.request import Message
from backends.sim.tokens import chat_tokens, tokenize
from tests import support
from tests.backends.conftest import SMALL, StartSim, profile

SYSTEM = "You answer questions about caches. " * 24
QUESTION = "Which blocks of this prompt does the simulator find in its prefix cache?"


def _messages(*texts: tuple[str, str]) -> list[Any]:
    """Chat messages (typed loosely: the openai client's message types are unions)."""
    return [{"role": role, "content": text} for role, text in texts]


def _tokens(messages: list[Any]) -> list[str]:
    return chat_tokens([Message(m["role"], m["content"]) for m in messages])


async def test_repeated_prompt_hits_its_full_blocks_and_counts_them(
    start_sim: StartSim, tmp_path: Path
) -> None:
    log = tmp_path / "usage.jsonl"
    sim = await start_sim(usage_log=log)
    messages = _messages(("system", SYSTEM), ("user", QUESTION))
    prompt = len(_tokens(messages))
    async with sim.client() as client:
        for _ in range(2):
            answer = await client.chat.completions.create(
                model=SMALL, messages=messages, max_tokens=5
            )
            assert answer.usage is not None and answer.usage.prompt_tokens == prompt
            # vLLM reports cached tokens in a response only with --enable-prompt-tokens-details.
            assert answer.usage.prompt_tokens_details is None
    hit = (prompt - 1) // 16 * 16
    assert hit > 100
    assert await sim.metric("vllm:prefix_cache_queries_total", model_name=SMALL) == 2 * prompt
    assert await sim.metric("vllm:prefix_cache_hits_total", model_name=SMALL) == hit
    info = {"block_size": "16", "num_gpu_blocks": "24576", "enable_prefix_caching": "True"}
    assert await sim.metric("vllm:cache_config_info", **info) == 1
    cached = [orjson.loads(line)["cached_tokens"] for line in log.read_bytes().splitlines()]
    assert cached == [0, hit]


@pytest.mark.parametrize("max_tokens", [24, None])  # cut by length / a natural end
async def test_next_turn_hits_into_the_previous_answer(
    start_sim: StartSim, max_tokens: int | None
) -> None:
    sim = await start_sim()
    turn1 = _messages(("system", SYSTEM), ("user", QUESTION))
    async with sim.client() as client:
        first = await client.chat.completions.create(
            model=SMALL,
            messages=turn1,
            max_tokens=max_tokens,
        )
        answer = first.choices[0].message.content or ""
        reason = first.choices[0].finish_reason
        assert reason == ("length" if max_tokens else "stop")
        turn2 = [*turn1, *_messages(("assistant", answer), ("user", "And the partial block?"))]
        await client.chat.completions.create(model=SMALL, messages=turn2, max_tokens=5)
    generated = tokenize(answer)
    computed = len(_tokens(turn1)) + len(generated) - (1 if reason == "length" else 0)
    hits = await sim.metric("vllm:prefix_cache_hits_total")
    assert hits == computed // 16 * 16
    assert hits > len(_tokens(turn1))  # past the first prompt, into the answer


async def _first_token_s(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], stream: bool
) -> float:
    sent = time.perf_counter()
    async with http.post(url, json={**body, "stream": stream}) as resp:
        assert resp.status == 200
        if not stream:
            await resp.read()  # one token: the answer is due at the first token
            return time.perf_counter() - sent
        async for line in resp.content:
            if line.startswith(b"data: {"):
                choices = orjson.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    return time.perf_counter() - sent
    raise AssertionError("no content chunk")


@pytest.mark.parametrize(("enabled", "stream"), [(True, True), (True, False), (False, True)])
async def test_a_hit_shortens_the_time_to_first_token(
    start_sim: StartSim, enabled: bool, stream: bool
) -> None:
    # 2 ms per prompt token at time scale 1: prefill dominates the time to first token.
    prof = profile(ttft_base_s=0.010, ttft_per_prompt_token_s=0.002, enable_prefix_caching=enabled)
    sim = await start_sim(prof, time_scale=1.0)
    messages = _messages(("system", SYSTEM), ("user", QUESTION))
    prompt = len(_tokens(messages))
    body = {"model": SMALL, "messages": messages, "max_tokens": 1}
    url = f"{sim.base_url}/v1/chat/completions"
    cold = await _first_token_s(sim.http, url, body, stream)
    warm = await _first_token_s(sim.http, url, body, stream)
    assert cold >= 0.010 + prompt * 0.002
    uncached = prompt - (prompt - 1) // 16 * 16 if enabled else prompt  # 3 tokens, or 195
    assert warm >= 0.010 + uncached * 0.002  # (sleeps are never short: lower bounds hold)
    if enabled:
        assert warm < cold - 0.25, (cold, warm)


async def test_off_in_the_profile_nothing_hits_nor_counts(start_sim: StartSim) -> None:
    sim = await start_sim(profile(enable_prefix_caching=False))
    messages = _messages(("system", SYSTEM), ("user", QUESTION))
    for _ in range(2):
        assert (await sim.post_chat({"messages": messages, "max_tokens": 3})).status == 200
    assert await sim.metric("vllm:prefix_cache_queries_total") == 0
    assert await sim.metric("vllm:prefix_cache_hits_total") == 0
    assert await sim.metric("vllm:cache_config_info", enable_prefix_caching="False") == 1


def _samples(text: str) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}" if s.name.endswith("_info") else s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_tiergate_sim_flag_turns_it_off(tmp_path: Path) -> None:
    port = support.free_port()
    proc, _ = support.start_sim(
        SMALL, port, tmp_path, time_scale=0, extra_args=["--no-enable-prefix-caching"]
    )
    try:
        base = f"http://127.0.0.1:{port}"
        body = {"messages": _messages(("system", SYSTEM), ("user", QUESTION)), "max_tokens": 2}
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
            async with http.get(f"{base}/metrics") as resp:
                samples = _samples(await resp.text())
    finally:
        proc.stop()
    assert samples["vllm:prompt_tokens_total"] > 0
    assert samples["vllm:prefix_cache_hits_total"] == 0
    assert any("'enable_prefix_caching', 'False'" in name for name in samples), samples
