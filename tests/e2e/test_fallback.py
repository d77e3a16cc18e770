"""The fault table of docs/fallback.md: each fault on the primary, through `tiergate serve`
and the official openai client, streamed and not (simulators as real processes, real Redis).

Timeouts are configured short for this stack (first token 2 s, stall 1.5 s, attempt 4 s), so a
fault of "20 s" or "30 s" is caught by the same rule in seconds."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from gateway.accounting.prices import load_litellm_cost_map
from gateway.accounting.records import Attempt, LedgerEntry
from gateway.queue.keys import LANES, RedisKeys
from router.features import estimate_tokens
from tests.support import TEST_KEYS, Stack, start_sim, until
from tests.support.ledger import wait_entry

SMALL, LARGE, EXTERNAL = "llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini"
PROFILES = (SMALL, LARGE, EXTERNAL)
FAST_TIER = {
    "retry": {"max_attempts": 2, "backoff_initial_s": 0.05, "jitter_s": 0.05,
              "retry_after_cap_s": 2.0},
    "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "stall_s": 1.5, "attempt_s": 4.0},
}  # fmt: skip
FALLBACK = {
    "tiers": {tier: FAST_TIER for tier in ("small", "large", "external")},
    "breaker": {"window_s": 20, "min_calls": 4, "failure_ratio": 0.5, "open_s": 5.0},
}
PROMPT = "Explain how a circuit breaker protects a distributed system, in detail."


class FaultStack(Stack):
    """The stack with this module's fault, usage and cost helpers."""

    def restart(self, profile: str) -> None:
        self.sims[profile].stop()
        proc, _ = start_sim(profile, self.sim_ports[profile], self.workdir)
        self.sims[profile] = proc

    def usage(self, profile: str, request_id: str) -> list[dict[str, Any]]:
        path = self.usage_logs[profile]
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [line for line in lines if line.get("request_id") == request_id]

    async def logged(self, profile: str, request_id: str) -> list[dict[str, Any]]:
        """``usage`` once there is a line: a stalled or cut answer is logged when the simulator
        sees its client go, a moment after the gateway gave up."""
        await until(
            lambda: self.usage(profile, request_id),
            5,
            what=f"{profile} logged nothing for {request_id}",
            every_s=0.05,
        )
        return self.usage(profile, request_id)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def price(self, deployment: str) -> tuple[Decimal, Decimal]:
        """USD per input and output token: the config's ``price``, else (a hosted model)
        litellm's cost map, as docs/costs.md says."""
        config = yaml.safe_load((self.workdir / "config.yaml").read_text())
        (dep,) = [d for d in config["deployments"] if d["model"] == deployment]
        if "price" in dep:
            per_mtok = dep["price"]
            return (
                Decimal(per_mtok["input_per_mtok"]).scaleb(-6),
                Decimal(per_mtok["output_per_mtok"]).scaleb(-6),
            )
        entry = load_litellm_cost_map()[deployment]
        return Decimal(entry["input_cost_per_token"]), Decimal(entry["output_cost_per_token"])

    def cost_micro_usd(self, *attempts: Attempt) -> int:
        """What the ``attempts``' tokens cost at their deployments' prices, in ledger
        micro-dollars (rounded once, as a row's cost is)."""
        usd = Decimal(0)
        for attempt in attempts:
            per_input, per_output = self.price(attempt.deployment)
            usd += per_input * attempt.prompt_tokens + per_output * attempt.completion_tokens
        return int(usd.scaleb(6).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))

    def prompt_estimate(self, model: str, prompt: str = PROMPT) -> int:
        """The edge's estimate of the prompt's tokens (rate limits, budgets), as
        ``/v1/route/explain`` reports it."""
        response = httpx.post(
            f"{self.base_url}/v1/route/explain",
            json={"model": model, "messages": messages(prompt), "max_tokens": 300},
            headers={"authorization": f"Bearer {TEST_KEYS['TIERGATE_KEY_ACME']}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return int(response.json()["estimated_prompt_tokens"])

    def queue(self, tier: str) -> tuple[int, int]:
        """The tier's slot leases held on its replicas, and the jobs waiting in its lanes."""
        keys = RedisKeys(self.prefix)
        client = redis.Redis.from_url(self.redis_url)
        try:
            held = sum(
                int(client.zcard(key))
                for key in client.scan_iter(match=keys.slots(tier, "*"), count=1000)
            )
            waiting = sum(int(client.get(keys.depth(tier, lane)) or 0) for lane in LANES)
        finally:
            client.close()
        return held, waiting


@pytest.fixture(scope="module")
def fstack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[FaultStack]:
    workdir = tmp_path_factory.mktemp("faults")
    with FaultStack.run(workdir, redis_url, PROFILES, fallback=FALLBACK) as running:
        yield running


@pytest.fixture(autouse=True)
def clean(fstack: FaultStack) -> Iterator[None]:
    """Every test starts and ends with no faults and closed breakers (as the gateway sees
    them: its breaker view refreshes every second)."""
    yield
    for profile in PROFILES:
        fstack.faults(profile)
    client = redis.Redis.from_url(fstack.redis_url)
    for key in client.scan_iter(match=f"{fstack.prefix}:{{breaker:*", count=1000):
        client.delete(key)
    client.close()
    deadline = time.monotonic() + 10
    while any(breaker_state(fstack, p) != 0 for p in PROFILES):
        assert time.monotonic() < deadline, "breakers did not close after the test"
        time.sleep(0.2)


def api(stack: FaultStack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1",
        api_key=TEST_KEYS["TIERGATE_KEY_ACME"],
        max_retries=0,
        timeout=60,
    )


def messages(prompt: str = PROMPT) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@dataclass
class Answer:
    text: str
    model: str
    request_id: str
    finish_reason: str | None
    headers: dict[str, str]
    elapsed_s: float


async def ask(stack: FaultStack, model: str, *, stream: bool, prompt: str = PROMPT) -> Answer:
    started = time.monotonic()
    async with api(stack) as client:
        if not stream:
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages(prompt), max_tokens=300
            )
            completion = raw.parse()
            choice = completion.choices[0]
            return Answer(
                choice.message.content or "",
                raw.headers["x-tiergate-model"],
                raw.headers["x-request-id"],
                choice.finish_reason,
                dict(raw.headers),
                time.monotonic() - started,
            )
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages(prompt), max_tokens=300, stream=True
        )
        text: list[str] = []
        finish: str | None = None
        async for chunk in raw.parse():
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        return Answer(
            "".join(text),
            raw.headers["x-tiergate-model"],
            raw.headers["x-request-id"],
            finish,
            dict(raw.headers),
            time.monotonic() - started,
        )


@dataclass
class Streamed:
    """A streamed answer as the client saw it, up to its end or the SDK's error."""

    request_id: str
    headers: dict[str, str]
    pieces: list[str] = field(default_factory=list)
    """The content of each chunk (the simulators send one token per chunk)."""
    finishes: list[str] = field(default_factory=list)
    error: openai.APIError | None = None


async def read_stream(stack: FaultStack, model: str) -> Streamed:
    async with api(stack) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages(), max_tokens=300, stream=True
        )
        got = Streamed(raw.headers["x-request-id"], dict(raw.headers))
        try:
            async for chunk in raw.parse():
                for choice in chunk.choices:
                    if choice.delta.content:
                        got.pieces.append(choice.delta.content)
                    if choice.finish_reason:
                        got.finishes.append(choice.finish_reason)
        except openai.APIError as exc:
            got.error = exc
    return got


async def entry(stack: FaultStack, request_id: str) -> LedgerEntry:
    return await wait_entry(stack.database_url, request_id)


def outcomes(row: LedgerEntry) -> list[tuple[str, str]]:
    return [(a.deployment, a.outcome) for a in row.attempts]


STREAMED = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])


# -- 429 --------------------------------------------------------------------------------------


@STREAMED
async def test_429_with_retry_after_waits_then_moves_on(fstack: FaultStack, stream: bool) -> None:
    fstack.faults(SMALL, rate_limit=True, retry_after=0.5)
    answer = await ask(fstack, "small", stream=stream)
    assert answer.model == LARGE and answer.text and answer.finish_reason == "stop"
    assert answer.elapsed_s >= 0.5  # the retry waited for Retry-After
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "rate_limited"), (SMALL, "rate_limited"), (LARGE, "ok")]
    assert row.outcome == "ok"


@STREAMED
async def test_429_without_retry_after_is_retried_with_backoff(
    fstack: FaultStack, stream: bool
) -> None:
    fstack.faults(SMALL, flap=True, error_status=429)  # the first call fails, the retry passes
    answer = await ask(fstack, "small", stream=stream)
    assert answer.model == SMALL and answer.text
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "rate_limited"), (SMALL, "ok")]


# -- 5xx --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503])
@STREAMED
async def test_5xx_moves_to_the_next_candidate(
    fstack: FaultStack, stream: bool, status: int
) -> None:
    fstack.faults(SMALL, error_status=status)
    answer = await ask(fstack, "small", stream=stream)
    assert answer.model == LARGE and answer.text and answer.finish_reason == "stop"
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "unavailable"), (SMALL, "unavailable"), (LARGE, "ok")]


# -- connections ------------------------------------------------------------------------------


@STREAMED
async def test_connection_reset_mid_request_moves_on(fstack: FaultStack, stream: bool) -> None:
    fstack.faults(SMALL, reset=True)
    answer = await ask(fstack, "small", stream=stream)
    assert answer.model == LARGE and answer.text
    row = await entry(fstack, answer.request_id)
    assert [o for _, o in outcomes(row)][-1] == "ok"
    assert {o for d, o in outcomes(row) if d == SMALL} == {"connect_error"}


async def test_connection_refused_moves_on(fstack: FaultStack) -> None:
    fstack.sims[SMALL].stop()
    try:
        for stream in (False, True):
            answer = await ask(fstack, "small", stream=stream)
            assert answer.model == LARGE and answer.text
            row = await entry(fstack, answer.request_id)
            assert outcomes(row)[-1] == (LARGE, "ok")
            assert {o for d, o in outcomes(row) if d == SMALL} <= {"connect_error", "circuit_open"}
    finally:
        fstack.restart(SMALL)


# -- silence ----------------------------------------------------------------------------------


@STREAMED
async def test_no_response_at_all_times_out_and_moves_on(fstack: FaultStack, stream: bool) -> None:
    fstack.faults(SMALL, hang=True)
    answer = await ask(fstack, "small", stream=stream)
    assert answer.model == LARGE and answer.text
    assert answer.elapsed_s < 10  # first-token 2 s / attempt 4 s, far inside the deadline
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "timeout"), (LARGE, "ok")]


@STREAMED
async def test_first_token_after_20s_times_out_and_moves_on(
    fstack: FaultStack, stream: bool
) -> None:
    fstack.faults(SMALL, slow_first_token_ms=20_000)
    answer = await ask(fstack, "small", stream=stream)
    assert answer.model == LARGE and answer.text
    assert answer.elapsed_s < 10
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "timeout"), (LARGE, "ok")]


async def test_stall_in_a_non_streamed_answer_times_out_and_moves_on(fstack: FaultStack) -> None:
    """The primary sends its status and headers, then stalls mid-answer (after 40 tokens, for
    30 s): the attempt timeout (4 s) ends the call, the 70B answers well inside the deadline,
    and the tenant pays for the answer it got, nothing for the one that never came."""
    fstack.faults(SMALL, stall_after_tokens=40, stall_ms=30_000)
    answer = await ask(fstack, "small", stream=False)
    assert answer.model == LARGE and answer.text and answer.finish_reason == "stop"
    assert answer.elapsed_s < 10
    row = await entry(fstack, answer.request_id)
    assert row.outcome == "ok"
    assert outcomes(row) == [(SMALL, "timeout"), (LARGE, "ok")]  # moved on, not retried
    stalled, served = row.attempts
    assert 3_900 <= stalled.latency_ms < 6_000  # held to the attempt timeout, no longer
    # no body, no usage; and our own GPUs send no invoice, so nothing is estimated
    assert (stalled.prompt_tokens, stalled.completion_tokens) == (0, 0)
    assert not row.usage_estimated and row.estimated_micro_usd is None
    (small_log,) = await fstack.logged(SMALL, answer.request_id)
    assert (small_log["fault"], small_log["finish_reason"]) == ("stall_after_tokens", "abort")
    (large_log,) = fstack.usage(LARGE, answer.request_id)
    assert large_log["status"] == 200
    assert (served.prompt_tokens, served.completion_tokens) == (
        large_log["prompt_tokens"],
        large_log["completion_tokens"],
    )
    assert (row.prompt_tokens, row.completion_tokens) == (
        served.prompt_tokens,
        served.completion_tokens,
    )
    assert row.cost_micro_usd == fstack.cost_micro_usd(served) > 0


async def test_hosted_call_that_times_out_is_booked_its_estimated_prompt(
    fstack: FaultStack,
) -> None:
    """The same stall on the hosted API: it read the prompt and bills it, but the answer (and
    its usage) never comes. The attempt is booked the edge's prompt estimate, no completion
    (unknown), flagged; the 70B's answer is booked as its simulator logged it."""
    fstack.faults(EXTERNAL, stall_after_tokens=40, stall_ms=30_000)
    answer = await ask(fstack, "external", stream=False)
    assert answer.model == LARGE and answer.finish_reason == "stop"
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(EXTERNAL, "timeout"), (LARGE, "ok")]
    stalled, served = row.attempts
    assert stalled.estimated and not served.estimated
    assert (stalled.prompt_tokens, stalled.completion_tokens) == (
        fstack.prompt_estimate("external"),
        0,
    )
    (ext_log,) = await fstack.logged(EXTERNAL, answer.request_id)
    assert ext_log["finish_reason"] == "abort" and ext_log["prompt_tokens"] > 0
    (large_log,) = fstack.usage(LARGE, answer.request_id)
    assert (served.prompt_tokens, served.completion_tokens) == (
        large_log["prompt_tokens"],
        large_log["completion_tokens"],
    )
    assert row.prompt_tokens == stalled.prompt_tokens + served.prompt_tokens
    assert row.cost_micro_usd == fstack.cost_micro_usd(stalled, served)
    assert row.estimated_micro_usd == fstack.cost_micro_usd(stalled) > 0


async def test_hosted_answer_that_cannot_be_read_is_booked_its_estimated_prompt(
    fstack: FaultStack,
) -> None:
    """The hosted API answers 200 with a body that is not JSON: it generated the answer and
    bills it, but neither it nor its usage can be read. Booked like the timeout above (prompt
    estimate, no completion, flagged), not retried in place; the 70B answers."""
    fstack.faults(EXTERNAL, malformed_after_tokens=0)
    answer = await ask(fstack, "external", stream=False)
    assert answer.model == LARGE and answer.finish_reason == "stop"
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(EXTERNAL, "protocol_error"), (LARGE, "ok")]
    unreadable, served = row.attempts
    assert unreadable.estimated and not served.estimated
    assert unreadable.error is not None and "could not be read" in unreadable.error
    assert (unreadable.prompt_tokens, unreadable.completion_tokens) == (
        fstack.prompt_estimate("external"),
        0,
    )
    (ext_log,) = await fstack.logged(EXTERNAL, answer.request_id)
    assert ext_log["status"] == 200 and ext_log["completion_tokens"] > 0  # what it will bill
    assert row.cost_micro_usd == fstack.cost_micro_usd(unreadable, served)
    assert row.estimated_micro_usd == fstack.cost_micro_usd(unreadable) > 0


async def test_hosted_answer_that_cannot_be_read_with_no_fallback_is_a_502(
    fstack: FaultStack,
) -> None:
    """The same with every candidate failing: the client gets the chain's OpenAI-shaped 502,
    and the row still books the hosted call's estimate."""
    for profile in PROFILES:
        fstack.faults(profile, malformed_after_tokens=0)
    async with api(fstack) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(
                model="external", messages=messages(), max_tokens=300
            )
    assert info.value.status_code == 502
    body = info.value.response.json()["error"]
    assert (body["type"], body["code"]) == ("api_error", "upstream_error")
    row = await entry(fstack, info.value.response.headers["x-request-id"])
    assert row.outcome == "upstream_error"
    hosted = [a for a in row.attempts if a.deployment == EXTERNAL]
    assert [a.outcome for a in hosted] == ["protocol_error"] and hosted[0].estimated
    assert row.estimated_micro_usd == fstack.cost_micro_usd(*hosted) > 0


# -- broken streams ---------------------------------------------------------------------------


async def reference(stack: FaultStack, model: str = "small") -> str:
    clean = await ask(stack, model, stream=True)
    assert len(clean.text.split()) > 45, "the test prompt needs an answer over 40 tokens"
    return clean.text


async def test_stream_cut_after_40_tokens_continues_on_the_fallback(fstack: FaultStack) -> None:
    expected = await reference(fstack)
    fstack.faults(SMALL, cut_after_tokens=40)
    answer = await ask(fstack, "small", stream=True)
    assert answer.text == expected  # one answer, as if nothing happened
    assert answer.finish_reason == "stop"
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "stream_cut"), (LARGE, "ok")]
    cut, rest = row.attempts
    assert not row.usage_estimated  # vLLM reported usage in every chunk
    # the ledger matches what each simulator says it produced for this request; of a cut
    # stream it books what reached the gateway, which may be less than the backend sent
    # (bytes in flight when the connection broke are lost with it)
    (small_log,) = fstack.usage(SMALL, answer.request_id)
    (large_log,) = fstack.usage(LARGE, answer.request_id)
    assert small_log["completion_tokens"] == 40
    assert 0 < cut.completion_tokens <= 40
    assert large_log["completion_tokens"] == rest.completion_tokens
    assert large_log["prompt_tokens"] == rest.prompt_tokens
    assert row.completion_tokens == cut.completion_tokens + rest.completion_tokens


async def test_stream_cut_non_streamed_moves_on(fstack: FaultStack) -> None:
    fstack.faults(SMALL, cut_after_tokens=40)
    answer = await ask(fstack, "small", stream=False)
    assert answer.model == LARGE and answer.finish_reason == "stop"


async def test_stream_stall_continues_on_the_fallback(fstack: FaultStack) -> None:
    expected = await reference(fstack)
    fstack.faults(SMALL, stall_after_tokens=40, stall_ms=30_000)
    answer = await ask(fstack, "small", stream=True)
    assert answer.text == expected and answer.finish_reason == "stop"
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "timeout"), (LARGE, "ok")]
    assert row.attempts[0].completion_tokens == 40


@pytest.mark.parametrize(
    ("fault", "outcome"),
    [
        ({"cut_after_tokens": 40}, "stream_cut"),
        ({"stall_after_tokens": 40, "stall_ms": 30_000}, "timeout"),
    ],
    ids=["cut", "stall"],
)
async def test_broken_stream_that_cannot_continue_ends_with_an_error_event(
    fstack: FaultStack, fault: dict[str, Any], outcome: str
) -> None:
    """External first: a hosted API's answer cannot be continued elsewhere. The client gets
    exactly the 40 tokens it sent, then the error event. The API reports usage only at its end,
    so the ledger books that attempt from estimates, flagged: the edge's prompt estimate and the
    text it delivered (docs/costs.md, "Estimated usage"), at the model's price."""
    clean = await read_stream(fstack, "external")
    assert len(clean.pieces) > 45, "the test prompt needs an answer over 40 tokens"
    fstack.faults(EXTERNAL, **fault)
    broken = await read_stream(fstack, "external")
    assert broken.error is not None  # the SDK raises
    assert broken.finishes == ["error"]  # never a clean end
    assert broken.pieces == clean.pieces[:40]
    row = await entry(fstack, broken.request_id)
    assert row.outcome == "stream_error"
    assert outcomes(row) == [(EXTERNAL, outcome)]  # the vLLM ones cannot continue it
    (attempt,) = row.attempts
    (log,) = await fstack.logged(EXTERNAL, broken.request_id)
    assert (log["finish_reason"], log["completion_tokens"]) == ("abort", 40)
    assert attempt.estimated and row.usage_estimated
    assert attempt.prompt_tokens == fstack.prompt_estimate("external") > 0
    assert attempt.completion_tokens == max(40, estimate_tokens("".join(broken.pieces)))
    assert (row.prompt_tokens, row.completion_tokens) == (
        attempt.prompt_tokens,
        attempt.completion_tokens,
    )
    assert row.cost_micro_usd == fstack.cost_micro_usd(attempt) > 0
    assert row.estimated_micro_usd == row.cost_micro_usd  # all of it rests on the estimate


async def test_rule_forbidding_continuation_ends_the_stream_instead(fstack: FaultStack) -> None:
    """The same cut that is continued by default ends with the error event when the tenant's
    rule says ``continuation: false``. The client has exactly the 40 tokens the primary sent;
    the ledger books that attempt's prompt and completion tokens as the simulator logged them
    (vLLM reports its usage in every chunk), at the deployment's price."""
    admin = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_ADMIN_KEY']}"}
    rules = "rules:\n  - id: no-continue\n    when: {}\n    then: {continuation: false}\n"
    async with httpx.AsyncClient(base_url=fstack.base_url, headers=admin, timeout=10) as http:
        put = await http.put("/v1/rules/acme", content=rules)
        assert put.status_code == 200, put.text
        try:
            await asyncio.sleep(1.0)  # hot reload reaches the worker within a second
            clean = await read_stream(fstack, "small")
            assert len(clean.pieces) > 45, "the test prompt needs an answer over 40 tokens"
            fstack.faults(SMALL, cut_after_tokens=40)
            broken = await read_stream(fstack, "small")
        finally:
            assert (await http.delete("/v1/rules/acme")).status_code == 200
    assert broken.headers["x-tiergate-rule"] == "rule:no-continue"
    assert broken.error is not None and broken.finishes == ["error"]
    assert broken.pieces == clean.pieces[:40]
    row = await entry(fstack, broken.request_id)
    assert row.outcome == "stream_error" and row.rule == "rule:no-continue"
    assert outcomes(row) == [(SMALL, "stream_cut")]
    (cut,) = row.attempts
    (log,) = await fstack.logged(SMALL, broken.request_id)
    assert log["completion_tokens"] == 40
    assert not cut.estimated and row.estimated_micro_usd is None  # the backend's own counts
    assert (cut.prompt_tokens, cut.completion_tokens) == (
        log["prompt_tokens"],
        log["completion_tokens"],
    )
    assert (row.prompt_tokens, row.completion_tokens) == (cut.prompt_tokens, cut.completion_tokens)
    assert row.cost_micro_usd == fstack.cost_micro_usd(cut) > 0


async def test_malformed_chunk_is_a_failed_attempt_not_garbage(fstack: FaultStack) -> None:
    expected = await reference(fstack)
    fstack.faults(SMALL, malformed_after_tokens=10)
    answer = await ask(fstack, "small", stream=True)
    assert answer.text == expected
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "protocol_error"), (LARGE, "ok")]
    plain = await ask(fstack, "small", stream=False)
    assert plain.model == LARGE and plain.text
    assert outcomes(await entry(fstack, plain.request_id))[0] == (SMALL, "protocol_error")


async def test_stream_without_done_is_a_failed_attempt(fstack: FaultStack) -> None:
    expected = await reference(fstack)
    fstack.faults(SMALL, end_after_tokens=10)
    answer = await ask(fstack, "small", stream=True)
    assert answer.text == expected
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(SMALL, "stream_cut"), (LARGE, "ok")]


async def test_complete_stream_missing_only_done_is_accepted(fstack: FaultStack) -> None:
    expected = await reference(fstack)
    fstack.faults(SMALL, omit_done=True)
    answer = await ask(fstack, "small", stream=True)
    assert answer.model == SMALL and answer.text == expected and answer.finish_reason == "stop"


# -- context ----------------------------------------------------------------------------------


@STREAMED
async def test_prompt_over_the_context_goes_where_it_fits(fstack: FaultStack, stream: bool) -> None:
    long_prompt = "word " * 9000  # over the 70B's 8192 tokens, inside the others'
    answer = await ask(fstack, "large", stream=stream, prompt=long_prompt)
    assert answer.model in {EXTERNAL, SMALL} and answer.text


@STREAMED
async def test_prompt_over_every_context_is_a_clear_400(fstack: FaultStack, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await ask(fstack, LARGE, stream=stream, prompt="word " * 9000)
    assert info.value.code == "context_length_exceeded"


# -- refusals ---------------------------------------------------------------------------------


@STREAMED
async def test_content_filter_refusal_is_passed_through(fstack: FaultStack, stream: bool) -> None:
    fstack.faults(EXTERNAL, content_filter=True)
    answer = await ask(fstack, "external", stream=stream)
    assert answer.model == EXTERNAL and answer.finish_reason == "content_filter"
    row = await entry(fstack, answer.request_id)
    assert outcomes(row) == [(EXTERNAL, "ok")]  # not retried elsewhere


# -- downgrade --------------------------------------------------------------------------------


@STREAMED
async def test_served_below_the_planned_tier_is_flagged(fstack: FaultStack, stream: bool) -> None:
    fstack.faults(LARGE, error_status=503)
    fstack.faults(EXTERNAL, error_status=503)
    answer = await ask(fstack, "large", stream=stream)
    assert answer.model == SMALL
    assert answer.headers.get("x-tiergate-downgraded") == "true"
    row = await entry(fstack, answer.request_id)
    assert "tiergate:downgraded" in row.tags
    fstack.faults(LARGE)
    fstack.faults(EXTERNAL)
    fine = await ask(fstack, "large", stream=stream)
    assert fine.model == LARGE and "x-tiergate-downgraded" not in fine.headers


# -- breaker ----------------------------------------------------------------------------------


def ready_status(stack: FaultStack) -> int:
    with urllib.request.urlopen(f"{stack.base_url}/readyz", timeout=5) as response:
        return int(response.status)


def breaker_state(stack: FaultStack, deployment: str) -> float | None:
    for line in stack.metrics().splitlines():
        if line.startswith("tiergate_breaker_state{") and f'"{deployment}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_flapping_primary_opens_the_breaker_then_recovers(fstack: FaultStack) -> None:
    fstack.faults(SMALL, flap=True, error_status=503)
    served: list[str] = []
    for _ in range(8):
        served.append((await ask(fstack, "small", stream=False)).model)
        if served[-1] == LARGE:
            break
    assert served[0] == SMALL  # a call fails once, then its retry passes
    assert served[-1] == LARGE  # the breaker opened: traffic flows to the fallback
    assert breaker_state(fstack, SMALL) == 2
    streamed = await ask(fstack, "small", stream=True)
    assert streamed.model == LARGE
    row = await entry(fstack, streamed.request_id)
    # skipped at once (circuit_open), or planned last by the router's snapshot and not reached
    assert {o for d, o in outcomes(row) if d == SMALL} <= {"circuit_open"}
    assert await asyncio.to_thread(ready_status, fstack) == 200  # open breaker, still ready
    fstack.faults(SMALL)  # healthy again
    started = time.monotonic()
    while True:
        answer = await ask(fstack, "small", stream=False)
        if answer.model == SMALL:
            break
        assert time.monotonic() - started < 30, "a recovered deployment gets traffic within 30 s"
        await asyncio.sleep(0.5)
    assert breaker_state(fstack, SMALL) == 0


async def test_rule_on_an_open_circuit_fires_on_real_requests(fstack: FaultStack) -> None:
    """The rule condition ``circuit_open`` sees the live breaker state (issue 9)."""
    admin = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_ADMIN_KEY']}"}
    rules = (
        "rules:\n  - id: small-down\n"
        f"    when: {{circuit_open: [{SMALL}]}}\n"
        "    then: {tier: external}\n"
    )
    async with httpx.AsyncClient(base_url=fstack.base_url, headers=admin, timeout=10) as http:
        assert (await http.put("/v1/rules/acme", content=rules)).status_code == 200
        try:
            await asyncio.sleep(1.0)
            closed = await ask(fstack, "auto", stream=False)
            assert closed.model != EXTERNAL  # breaker closed: the rule does not fire
            fstack.faults(SMALL, flap=True, error_status=503)
            for _ in range(12):
                await ask(fstack, "small", stream=False)
                if breaker_state(fstack, SMALL) == 2:
                    break
            assert breaker_state(fstack, SMALL) == 2
            await asyncio.sleep(1.5)  # the edge's breaker view refreshes every second
            async with api(fstack) as client:
                raw = await client.chat.completions.with_raw_response.create(
                    model="auto", messages=messages("What is the capital of France?")
                )
            assert raw.headers["x-tiergate-rule"] == "rule:small-down"
            assert raw.headers["x-tiergate-tier"] == "external"
            row = await entry(fstack, raw.headers["x-request-id"])
            assert row.rule == "rule:small-down" and row.deployment == EXTERNAL
        finally:
            fstack.faults(SMALL)
            assert (await http.delete("/v1/rules/acme")).status_code == 200


# -- everything down --------------------------------------------------------------------------


@STREAMED
async def test_all_candidates_down_is_one_clear_502(fstack: FaultStack, stream: bool) -> None:
    for profile in PROFILES:
        fstack.faults(profile, error_status=503)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        await ask(fstack, "small", stream=stream)
    assert time.monotonic() - started < 5
    assert info.value.status_code == 502
    message = str(info.value.message)
    for profile in PROFILES:
        assert profile in message


# -- drain ------------------------------------------------------------------------------------


async def test_failing_health_drains_the_deployment_until_it_recovers(fstack: FaultStack) -> None:
    fstack.faults(SMALL, unhealthy=True)  # a spot GPU being reclaimed: /health answers 503
    started = time.monotonic()
    while breaker_state(fstack, SMALL) != 2:
        assert time.monotonic() - started < 10, "drained within a few health checks"
        await asyncio.sleep(0.2)
    for stream in (False, True):
        answer = await ask(fstack, "small", stream=stream)
        assert answer.model == LARGE
        row = await entry(fstack, answer.request_id)
        assert {o for d, o in outcomes(row) if d == SMALL} <= {"circuit_open"}  # never called
    fstack.faults(SMALL)
    started = time.monotonic()
    while (await ask(fstack, "small", stream=False)).model != SMALL:
        assert time.monotonic() - started < 30, "a recovered deployment gets traffic within 30 s"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize(
    ("preemption", "failed", "within_s"),
    [
        ({"error_status": 503, "unhealthy": True}, "unavailable", 3.0),
        # the held calls never answer: the failed health check ends them (no attempt timeout)
        ({"hang": True, "unhealthy": True}, "unavailable", 3.0),
    ],
    ids=["503-and-health", "health-only"],
)
async def test_preemption_with_work_in_flight_and_queued_loses_nothing(
    fstack: FaultStack, preemption: dict[str, Any], failed: str, within_s: float
) -> None:
    """A spot GPU reclaimed while busy: every slot of the primary holds a call in flight (the
    simulator holds them, as a busy engine does) and more requests wait in the queue for it.
    Then the preemption: /health fails, and the deployment answers 503 to everything, the held
    calls included; or, health only, it never answers them, and the drain ends them at the next
    health check (well before the attempt timeout, 4 s), which frees the slots the queued ones
    wait for.
    Every request is answered by the 70B (none lost, none 5xx), answered and booked once; and
    new requests go to the 70B at once, without calling the primary."""
    config = yaml.safe_load((fstack.workdir / "config.yaml").read_text())
    (spec,) = [d for d in config["deployments"] if d["model"] == SMALL]
    slots = sum(replica["max_num_seqs"] for replica in spec["replicas"])
    queued = 6
    fstack.faults(SMALL, hang=True)
    async with api(fstack) as client:

        async def one() -> tuple[str, str, str]:
            raw = await client.chat.completions.with_raw_response.create(
                model="small", messages=messages(), max_tokens=50
            )
            text = raw.parse().choices[0].message.content or ""
            return raw.headers["x-request-id"], raw.headers["x-tiergate-model"], text

        tasks = [asyncio.create_task(one()) for _ in range(slots + queued)]
        try:
            # the preemption must come before the attempt timeout (4 s) ends the held calls
            await until(
                lambda: fstack.queue("small") == (slots, queued),
                3.0,
                what=f"{slots} calls in flight and {queued} queued, got {fstack.queue('small')}",
            )
            fstack.faults(SMALL, **preemption)
            preempted = time.monotonic()
            answers = await asyncio.gather(*tasks)
            assert time.monotonic() - preempted < within_s
        finally:
            for task in tasks:
                task.cancel()
    assert {model for _, model, _ in answers} == {LARGE} and all(text for *_, text in answers)
    in_flight = 0
    for request_id, _, _ in answers:
        primary = fstack.usage(SMALL, request_id)
        assert all(line["status"] == 503 for line in primary)  # nothing served by the primary
        (served,) = fstack.usage(LARGE, request_id)  # answered once
        assert served["status"] == 200
        assert fstack.usage(EXTERNAL, request_id) == []
        row = await entry(fstack, request_id)  # one row per request id
        assert row.outcome == "ok" and row.deployment == LARGE
        assert outcomes(row)[-1] == (LARGE, "ok")
        assert {o for d, o in outcomes(row) if d == SMALL} <= {failed, "circuit_open"}
        in_flight += (SMALL, failed) in outcomes(row)
        assert (row.prompt_tokens, row.completion_tokens) == (
            served["prompt_tokens"],
            served["completion_tokens"],
        )  # booked once: the answer served, not a token more
    assert in_flight >= slots  # every held call failed and was retried elsewhere
    await until(lambda: breaker_state(fstack, SMALL) == 2, 3.0, what="the breaker opened")
    for _ in range(3):  # the drain holds: new work never reaches the preempted deployment
        answer = await ask(fstack, "small", stream=False)
        assert answer.model == LARGE
        assert fstack.usage(SMALL, answer.request_id) == []
        assert {o for d, o in outcomes(await entry(fstack, answer.request_id)) if d == SMALL} <= {
            "circuit_open"
        }
