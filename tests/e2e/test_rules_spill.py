"""Spill-over on a really long queue, end to end. `tiergate serve` with a large tier of one slot
(the 70B simulator at fixed, slow latencies: about 6 s a job) is flooded with requests of acme
and globex pinned to the large tier, until the wait a new request of theirs would see is far over
the thresholds (the expected wait is the request's own: behind the higher lanes and its tenant's
fair share of its lane). Then:

(a) a tenant rule on `queue_wait_s` sends new requests to the external tier: explain shows the
    rule firing on the live wait, real requests (streamed and not) are served by the external
    simulator, and their ledger rows name the rule;
(b) a tenant without such a rule spills by the built-in default (`spill:large_wait`, over 30 s),
    the same three ways;
(b') a tenant with no work waiting (initech) would start after its fair share of the others'
    jobs, well under the default target, and is not spilled;
(c) once the flood has left the queue (its requests reach their deadline: the worker does not
    start a job it cannot finish, the edge answers 504), routing returns to the large tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.rules import DEFAULT_LARGE_WAIT_TARGET_S
from tests.support import TEST_KEYS, Stack
from tests.support.ledger import wait_entry

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")
SMALL, LARGE, EXTERNAL = PROFILES
TTFT_MS, ITL_MS, JOB_TOKENS = 200, 300, 20
"""A flood job on the large simulator: 200 ms to the first token, 300 ms each after: ~6 s."""
FLOOD = 10
FLOOD_DEADLINE_MS = 20_000
"""Three flood jobs fit in it (~6 s each, one slot); the other seven leave the queue at ~18 s,
when the worker would start them with less time left than a job takes."""
RULE_WAIT_S = 15
RULE = f"""
rules:
  - id: large-queue-long
    description: do not wait more than {RULE_WAIT_S} s for the large tier
    when:
      model: [auto]
      queue_wait_s:
        large: {{gt: {RULE_WAIT_S}}}
    then:
      tier: external
      fallback: [large, small]
"""
HARD = (  # the classifier scores it 0.58: over acme's threshold (0.32) and globex's (0.35)
    "Review this Python code for race conditions and fix them:\n```python\nimport threading\n"
    "balance = 0\ndef deposit(n):\n    global balance\n    for _ in range(n):\n"
    "        tmp = balance\n        balance = tmp + 1\nthreads = [threading.Thread(target=deposit, "
    "args=(10000,)) for _ in range(8)]\n```\nExplain the memory-model issue and give a lock-free "
    "alternative."
)


def one_at_a_time(config: dict[str, Any]) -> None:
    for dep in config["deployments"]:
        if dep["model"] == LARGE:
            dep["replicas"][0]["max_num_seqs"] = 1  # one request at a time: a long queue


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    fixed = ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
    with Stack.run(
        tmp_path_factory.mktemp("spill"), redis_url, PROFILES, edit=one_at_a_time,
        sim_args={LARGE: fixed},
    ) as running:  # fmt: skip
        yield running


def _key(tenant: str) -> str:
    return TEST_KEYS[f"TIERGATE_KEY_{tenant.upper()}"]


def _hard() -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": HARD}], "max_tokens": 4}


async def _explain(http: httpx.AsyncClient, tenant: str) -> dict[str, Any]:
    reply = await http.post(
        "/v1/route/explain", json=_hard(), headers={"authorization": f"Bearer {_key(tenant)}"}
    )
    assert reply.status_code == 200, reply.text
    plan: dict[str, Any] = reply.json()
    return plan


async def _explain_until(
    http: httpx.AsyncClient, tenant: str, done: Callable[[dict[str, Any]], bool], limit_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while True:
        plan = await _explain(http, tenant)
        if done(plan):
            return plan
        assert time.monotonic() < deadline, f"not reached in {limit_s} s: {plan}"
        await asyncio.sleep(0.1)


def _large_wait(plan: dict[str, Any]) -> float:
    return float(plan["signals"]["expected_wait_s"]["large"])


def _skipped(plan: dict[str, Any]) -> dict[str, str]:
    return {s["rule"]: s["why"] for s in plan["skipped_rules"]}


async def _ask(base_url: str, tenant: str, *, stream: bool) -> tuple[str, dict[str, str]]:
    """A real request for the hard prompt: its request id and the gateway's headers."""
    api = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=_key(tenant), max_retries=0)
    async with api:
        body = _hard()
        if stream:
            raw = await api.chat.completions.with_raw_response.create(
                model=body["model"], messages=body["messages"], max_tokens=body["max_tokens"],
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in raw.parse()]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        else:
            raw = await api.chat.completions.with_raw_response.create(
                model=body["model"], messages=body["messages"], max_tokens=body["max_tokens"]
            )
            assert raw.parse().choices[0].message.content
    return raw.headers["x-request-id"], dict(raw.headers)


async def _flood_one(http: httpx.AsyncClient, i: int) -> tuple[str, int]:
    reply = await http.post(
        "/v1/chat/completions",
        json={
            "model": "large",
            "messages": [{"role": "user", "content": f"Flood {i}: tell me a long story."}],
            "max_tokens": JOB_TOKENS,
        },
        headers={
            "authorization": f"Bearer {_key(('acme', 'globex')[i % 2])}",
            "x-tiergate-timeout-ms": str(FLOOD_DEADLINE_MS),
        },
    )
    return reply.headers["x-request-id"], reply.status_code


def _served(usage_log: Path) -> set[str]:
    """The request ids a simulator answered 200, from its usage log."""
    lines = usage_log.read_text().splitlines() if usage_log.exists() else []
    return {r["request_id"] for r in map(json.loads, lines) if r["status"] == 200}


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _served_by(path: Path, request_ids: set[str]) -> None:
    """Every one of ``request_ids`` is in the simulator's usage log, answered 200."""
    deadline = time.monotonic() + 5
    while True:
        served = _served(path)
        if request_ids <= served:
            return
        assert time.monotonic() < deadline, f"not served by {path.name}: {request_ids - served}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(150)
async def test_long_large_queue_spills_by_rule_and_by_default_then_returns(stack: Stack) -> None:
    admin = {"authorization": f"Bearer {TEST_KEYS['TIERGATE_ADMIN_KEY']}"}
    async with (
        httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http,
        contextlib.AsyncExitStack() as cleanup,
    ):
        put = await http.put("/v1/rules/acme", content=RULE, headers=admin)
        assert put.status_code == 200, put.text
        await _explain_until(http, "acme", lambda p: p["rules_version"] == 1, 5)

        # An idle large tier: the hard prompt goes large for both tenants; acme's rule is tried
        # and does not hold, on the live wait.
        for tenant in ("acme", "globex"):
            plan = await _explain(http, tenant)
            assert (plan["tier"], plan["rule"]) == ("large", "auto:threshold"), plan
            assert _large_wait(plan) < RULE_WAIT_S
        why = _skipped(await _explain(http, "acme"))["large-queue-long"]
        assert why.startswith("queue_wait_s.large: ") and why.endswith(f"is not > {RULE_WAIT_S}")

        flood = [asyncio.create_task(_flood_one(http, i)) for i in range(FLOOD)]
        cleanup.push_async_callback(_cancel, flood)  # if the test fails before they end
        flooded = time.monotonic()
        # The wait passes the default target once a first job has measured the service time
        # (~6 s): of globex's, about 9 jobs ahead (its own 5, and acme's, which fair share
        # alternates with them) x 6 s on one slot.
        spilled = await _explain_until(
            http, "globex", lambda p: p["rule"] == "spill:large_wait", limit_s=20
        )
        assert spilled["tier"] == "external" and spilled["deployments"][0] == EXTERNAL
        assert _large_wait(spilled) > DEFAULT_LARGE_WAIT_TARGET_S
        assert f"> target {DEFAULT_LARGE_WAIT_TARGET_S:g} s → external" in spilled["reason"]

        # (a) the rule fires on the live wait
        fired = await _explain(http, "acme")
        assert (fired["rule"], fired["tier"]) == ("rule:large-queue-long", "external"), fired
        assert fired["deployments"] == [EXTERNAL, LARGE, SMALL]
        assert _large_wait(fired) > RULE_WAIT_S
        ruled = [await _ask(stack.base_url, "acme", stream=s) for s in (False, True)]
        # (b) no such rule: the default spill-over
        defaulted = [await _ask(stack.base_url, "globex", stream=s) for s in (False, True)]
        window_s = time.monotonic() - flooded
        for (_rid, headers), rule in [
            *((r, "rule:large-queue-long") for r in ruled),
            *((d, "spill:large_wait") for d in defaulted),
        ]:
            assert (headers["x-tiergate-rule"], headers["x-tiergate-tier"]) == (rule, "external")
            assert headers["x-tiergate-model"] == EXTERNAL

        # (b') a tenant with nothing waiting starts after about one job of each of the others
        # (fair share): under the default target, it is not spilled
        fair = await _explain(http, "initech")
        assert (fair["tier"], fair["rule"]) == ("large", "auto:threshold"), fair
        assert 0 < _large_wait(fair) < DEFAULT_LARGE_WAIT_TARGET_S < _large_wait(spilled)

        # (c) the flood leaves the queue at its deadline; routing returns to the large tier
        back = await _explain_until(
            http, "globex", lambda p: p["tier"] == "large", limit_s=FLOOD_DEADLINE_MS / 1000 + 10
        )
        drained_s = time.monotonic() - flooded
        assert back["rule"] == "auto:threshold" and _large_wait(back) < RULE_WAIT_S
        calm = await _explain(http, "acme")
        assert (calm["tier"], calm["rule"]) == ("large", "auto:threshold"), calm
        assert _skipped(calm)["large-queue-long"].endswith(f"is not > {RULE_WAIT_S}")
        returned = [await _ask(stack.base_url, t, stream=False) for t in ("acme", "globex")]
        for _rid, headers in returned:
            assert (headers["x-tiergate-tier"], headers["x-tiergate-rule"]) == (
                "large", "auto:threshold"
            )  # fmt: skip
            assert headers["x-tiergate-model"] == LARGE

        statuses = await asyncio.gather(*flood)

    # The real requests were served where the headers say, and the ledger names the rule.
    await _served_by(stack.usage_logs[EXTERNAL], {rid for rid, _ in [*ruled, *defaulted]})
    await _served_by(stack.usage_logs[LARGE], {rid for rid, _ in returned})
    expected = [
        *((rid, "rule:large-queue-long", EXTERNAL) for rid, _ in ruled),
        *((rid, "spill:large_wait", EXTERNAL) for rid, _ in defaulted),
        *((rid, "auto:threshold", LARGE) for rid, _ in returned),
    ]
    for rid, rule, deployment in expected:
        entry = await wait_entry(stack.database_url, rid)
        assert (entry.rule, entry.deployment, entry.outcome) == (rule, deployment, "ok"), entry

    # The flood: every request answered once, served (200) or timed out in the queue (504).
    assert len({rid for rid, _ in statuses}) == FLOOD
    codes = sorted(code for _, code in statuses)
    assert set(codes) == {200, 504}, codes
    for rid, code in statuses:
        entry = await wait_entry(stack.database_url, rid)
        assert (entry.status_code, entry.rule) == (code, "pin:tier"), entry
    print(
        f"large wait {_large_wait(spilled):.1f} s (rule at {_large_wait(fired):.1f} s); spilled "
        f"requests done {window_s:.1f} s after the flood, back to large after {drained_s:.1f} s; "
        f"flood statuses {codes}"
    )
