"""After a burst of traffic, every ``tiergate_`` metric that deploy/monitoring's alerts and
dashboard read is on a running gateway's ``/metrics``, and every ``vllm:`` metric on a
simulator's; the access log is JSON with the request id and no prompt text.

The stack is this module's own (three simulators, ``tiergate serve``, the real Redis, SQLite):
the 70B deployment has no price, so unpriced traffic is real; acme has a soft budget; and the 8B
simulator fails for a while, so fallbacks and the breaker are real too.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.promql import used_metrics
from tests.support import TEST_KEYS, Stack

# Its own stack of four processes takes 30-60 s to start on a loaded machine: CI's slow suite.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")
SECRET_PROMPT = "zebra-kumquat-7731 what is two plus two"


def unpriced_70b_soft_budget(config: dict[str, Any]) -> None:
    for dep in config["deployments"]:
        if dep["model"] == "llama-3.1-70b-instruct-awq":
            dep.pop("price", None)  # unpriced: booked as unknown, never as zero
    # a soft budget (never refuses): its spent-ratio gauge is what the budget alerts read
    config["tenants"]["acme"]["budgets"] = [
        {"name": "monthly", "limit_usd": "1000", "window": "month", "mode": "soft"}
    ]


@pytest.fixture(scope="module")
def metrics_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("metrics")
    with Stack.run(workdir, redis_url, PROFILES, edit=unpriced_70b_soft_budget) as running:
        yield running


def _samples(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def _burst(stack: Stack) -> list[str]:
    client = openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key=TEST_KEYS["TIERGATE_KEY_ACME"], max_retries=0
    )
    ids = []
    messages = [{"role": "user", "content": SECRET_PROMPT}]
    for model in ("auto", "small", "large", "external", "llama-3.1-70b-instruct-awq"):
        raw = client.chat.completions.with_raw_response.create(model=model, messages=messages)
        ids.append(raw.headers["x-request-id"])
        with client.chat.completions.create(
            model=model, messages=messages, stream=True, stream_options={"include_usage": True}
        ) as stream:
            for _chunk in stream:
                pass
    # the 8B simulator fails for a while: small requests fall back, its breaker opens
    stack.faults("llama-3.1-8b-instruct", error_status=503)
    try:
        for _ in range(6):
            client.chat.completions.create(model="small", messages=messages)
    finally:
        stack.faults("llama-3.1-8b-instruct")
    return ids


@pytest.fixture(scope="module")
def burst(metrics_stack: Stack) -> list[str]:
    return _burst(metrics_stack)


def test_every_tiergate_metric_of_alerts_and_dashboard_is_exported(
    metrics_stack: Stack, burst: list[str]
) -> None:
    wanted = {n for n in used_metrics() if n.startswith("tiergate_")}
    assert len(wanted) >= 12
    exported = _samples(metrics_stack.admin_url)
    assert sorted(wanted - exported) == []


def test_every_vllm_metric_of_alerts_and_dashboard_is_on_a_simulator(
    metrics_stack: Stack, burst: list[str]
) -> None:
    wanted = {n for n in used_metrics() if n.startswith("vllm:")}
    assert wanted
    for profile in ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"):
        exported = _samples(metrics_stack.sim_url(profile))
        assert sorted(wanted - exported) == [], profile


def test_the_burst_moved_the_counters_the_alerts_watch(
    metrics_stack: Stack, burst: list[str]
) -> None:
    with urllib.request.urlopen(f"{metrics_stack.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    assert values["tiergate_unknown_price_requests_total"] >= 2  # the unpriced 70B answered
    assert values["tiergate_fallbacks_total"] >= 1  # small fell back past the failing 8B
    assert values["tiergate_cost_usd_total"] > 0
    assert values["tiergate_time_to_first_token_seconds_count"] >= 5


def test_access_log_is_json_with_request_ids_and_no_prompt_text(
    metrics_stack: Stack, burst: list[str]
) -> None:
    deadline = time.monotonic() + 10  # lines are written by the gateway's log thread
    while True:
        lines = [
            json.loads(line)
            for line in metrics_stack.gateway.output().splitlines()
            if line.startswith("{")
        ]
        access = [line for line in lines if line["logger"] == "tiergate.access"]
        logged = {line["request_id"] for line in access}
        if set(burst) <= logged or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert set(burst) <= logged
    assert all({"tenant", "tier", "deployment", "outcome", "latency_ms"} <= set(a) for a in access)
    assert SECRET_PROMPT not in metrics_stack.gateway.output()
