"""The executor's walk of a plan, on scripted backends (``backends.scripted``): what each
deployment is asked and in which order, retries in place, waits taken through the injected
sleep, a broken stream continued elsewhere, and the error the client gets. The adapters' HTTP
behaviour (timeouts, error mapping) is tested against the simulator in ``test_fallback_gaps``;
here only the executor's decisions are, exactly, and without waiting."""

from __future__ import annotations

import dataclasses

import pytest

from backends.errors import (
    BackendRateLimited,
    BackendRejected,
    BackendStreamCut,
    BackendUnavailable,
)
from backends.scripted import Answer, ScriptedBackend, Step, reply, stream_of
from gateway.accounting.prices import PriceBook
from gateway.faults.chains import TierFaults
from gateway.faults.policy import RetryPolicy
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from router.catalog import Catalog, DeploymentSpec, Tier
from tests.gateway.queue.conftest import bare_executor, outcomes, plan_job, reply_text, run_job

FAULTS = TierFaults(
    retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.25, jitter_s=0.0), attempt_s=20.0
)


class Sleeps:
    """The executor's sleep: keeps the waits asked for, takes none."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)


@dataclasses.dataclass
class Rig:
    executor: Executor
    backends: dict[str, ScriptedBackend]
    sleeps: Sleeps


def rig(**scripts: list[Answer]) -> Rig:
    """One deployment (tier small, vLLM) per keyword, its one replica answering its script."""
    backends = {name: ScriptedBackend(f"{name}#0", script) for name, script in scripts.items()}
    pool = BackendPool({name: [Replica(backend, 4)] for name, backend in backends.items()})
    catalog = Catalog(
        tuple(DeploymentSpec(model=name, tier=Tier.SMALL, max_model_len=16384) for name in scripts)
    )
    sleeps = Sleeps()
    executor = bare_executor(
        pool, catalog, PriceBook({}), faults={Tier.SMALL: FAULTS}, sleep=sleeps
    )
    return Rig(executor, backends, sleeps)


async def test_a_retryable_failure_is_retried_in_place_then_the_plan_goes_on() -> None:
    down = BackendUnavailable("overloaded", status=503)
    r = rig(a=[down, down], b=[reply("fine", model="b", completion_tokens=1)])
    j = plan_job("a", "b")
    entry, replies = await run_job(r.executor, j)
    assert outcomes(entry) == [("a", "unavailable"), ("a", "unavailable"), ("b", "ok")]
    assert [c.kind for c in r.backends["a"].calls] == ["chat", "chat"]  # max_attempts: 2
    (asked,) = r.backends["b"].requests
    assert asked.request_id == j.request_id and asked.body["messages"] == j.body["messages"]
    assert r.sleeps.taken == [0.25]  # one backoff, between a's two calls; none before b
    assert (replies[-1].kind, entry.outcome, entry.deployment) == ("result", "ok", "b")
    assert (entry.prompt_tokens, entry.completion_tokens) == (10, 1)


async def test_a_rate_limit_waits_the_servers_retry_after() -> None:
    limited = BackendRateLimited("slow down", status=429, retry_after=1.5)
    r = rig(a=[limited, reply("now")])
    entry, _ = await run_job(r.executor, plan_job("a"))
    assert outcomes(entry) == [("a", "rate_limited"), ("a", "ok")]
    assert r.sleeps.taken == [1.5]  # the server's wait, not the backoff's 0.25 s


async def test_a_rejection_is_not_retried_and_keeps_the_providers_code() -> None:
    rejected = BackendRejected("tools must be a list", status=400, code="invalid_value")
    r = rig(a=[rejected])
    entry, replies = await run_job(r.executor, plan_job("a"))
    assert len(r.backends["a"].calls) == 1 and r.sleeps.taken == []
    (answer,) = replies
    assert (answer.kind, answer.meta.status) == ("error", 400)
    assert answer.data["error"]["code"] == "invalid_value"
    assert "a#0" not in answer.data["error"]["message"]  # the replica's name stays inside
    assert entry.outcome == "backend_rejected"


async def test_a_stream_cut_after_text_is_continued_from_what_the_client_got() -> None:
    cut: list[Step] = [*stream_of("Hel", "lo", model="a")[:2], BackendStreamCut("connection reset")]
    r = rig(a=[cut], b=[stream_of(" world", model="b")])
    j = plan_job("a", "b", stream=True)
    entry, replies = await run_job(r.executor, j)
    assert outcomes(entry) == [("a", "stream_cut"), ("b", "ok")]
    assert reply_text(replies) == "Hello world" and replies[-1].kind == "end"
    (asked,) = r.backends["b"].requests
    assert asked.body["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert asked.body["continue_final_message"] is True
    assert asked.body["max_tokens"] == 120 - 2  # two tokens already delivered
    assert {r.data["model"] for r in replies if r.kind == "chunk"} == {"a"}  # one answer


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_plan_that_runs_out_is_a_502_naming_every_attempt(stream: bool) -> None:
    down = BackendUnavailable("overloaded", status=503)
    r = rig(a=[down, down])
    entry, replies = await run_job(r.executor, plan_job("a", stream=stream))
    assert (replies[-1].kind, replies[-1].meta.status) == ("error", 502)
    error = replies[-1].data["error"]
    assert error["code"] == entry.outcome == "upstream_error"
    assert "(a: unavailable, a: unavailable)" in error["message"]
    assert [c.kind for c in r.backends["a"].calls] == ["stream" if stream else "chat"] * 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_each_deployment_is_sent_the_body_without_the_hints_it_cannot_take(
    stream: bool,
) -> None:
    """``RoutePlan.dropped`` (reasoning parameters of an aliased request): a falls over to b,
    which reasons; a is asked without them, b with them."""
    down = BackendUnavailable("overloaded", status=503)
    answer = stream_of("ok", model="b") if stream else reply("ok", model="b")
    r = rig(a=[down, down], b=[answer])
    j = plan_job("a", "b", stream=stream, reasoning_effort="low", verbosity="low")
    j = dataclasses.replace(
        j, plan=dataclasses.replace(j.plan, dropped=(("a", ("reasoning_effort", "verbosity")),))
    )
    entry, _ = await run_job(r.executor, j)
    assert outcomes(entry) == [("a", "unavailable"), ("a", "unavailable"), ("b", "ok")]
    for asked in r.backends["a"].requests:
        assert "reasoning_effort" not in asked.body and "verbosity" not in asked.body
    (asked,) = r.backends["b"].requests
    assert asked.body["reasoning_effort"] == "low" and asked.body["verbosity"] == "low"
    assert j.body["reasoning_effort"] == "low"  # the job's own body is left as it was
