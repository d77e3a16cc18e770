"""Usage the gateway has to estimate: a hosted API (litellm, the simulator in its OpenAI flavour)
reports usage only at the end of a stream and none for an answer it never sent, yet bills the
call. Calls it bills are booked from the edge's prompt estimate, flagged; vLLM's broken streams
keep the backend's own counts. The executor on real HTTP, real Redis (slot leases), real prices.

litellm is imported for this module (it takes seconds); its stream wrapper's pydantic
deprecation warnings are ignored as in ``tests/backends/test_litellm_backend.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends.litellm_backend import LiteLLMBackend
from backends.openai_http import VLLMBackend
from backends.sim.request import Message
from backends.sim.tokens import prompt_tokens
from backends.types import Usage
from gateway.accounting.prices import Price, PriceBook
from gateway.accounting.records import LedgerEntry, to_micro
from gateway.observability.tracing import Tracing
from gateway.queue.jobs import Job, Reply
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from router.catalog import Catalog, DeploymentSpec, Tier
from router.features import PromptFeatures, estimate_tokens
from router.plan import RoutePlan
from tests.gateway.queue.conftest import MODEL, CountingSim, bare_executor, job
from tests.support import until

pytestmark = pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211"
)

HOSTED = "gpt-4o-mini"
PRICES = {
    HOSTED: Price.per_mtok(Decimal("0.15"), Decimal("0.60")),
    MODEL: Price.per_mtok(Decimal("0.03"), Decimal("0.06")),
}


@dataclasses.dataclass
class Rig:
    executor: Executor
    hosted: CountingSim
    vllm: CountingSim
    tracing: Tracing
    spans: InMemorySpanExporter


@pytest.fixture
async def rig(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim: Callable[..., Awaitable[CountingSim]],
) -> AsyncIterator[Rig]:
    # 20 tokens a second: a stream is still running when its client leaves
    hosted = await start_sim(1, itl_s=0.05, model=HOSTED)
    vllm = await start_sim(1, itl_s=0.05)
    keys = RedisKeys(key_prefix)
    session = aiohttp.ClientSession()
    external = LiteLLMBackend(
        f"{HOSTED}#0", f"openai/{HOSTED}", api_base=f"{hosted.url}/v1", api_key="sk-test",
        session=session,
    )  # fmt: skip
    pool = BackendPool(
        {
            HOSTED: [Replica(external, 1, slot_key=keys.slots("external", f"{HOSTED}#0"))],
            MODEL: [
                Replica(
                    VLLMBackend(name=f"{MODEL}#0", base_url=vllm.url, session=session),
                    1,
                    slot_key=keys.slots("small", f"{MODEL}#0"),
                )
            ],
        },
        leases=SlotLeases(redis_conn),
        owner="w1",
    )
    pool.start()
    catalog = Catalog(
        (
            DeploymentSpec(model=MODEL, tier=Tier.SMALL, max_model_len=16384),
            DeploymentSpec(
                model=HOSTED, tier=Tier.EXTERNAL, max_model_len=128_000, provider="litellm"
            ),
        )
    )
    spans = InMemorySpanExporter()
    tracing = Tracing.with_exporter(spans, batch=False)
    executor = bare_executor(pool, catalog, PriceBook(PRICES), tracing=tracing)
    yield Rig(executor, hosted, vllm, tracing, spans)
    await tracing.aclose()
    await pool.aclose()
    await external.aclose()
    await session.close()


def a_job(deployment: str, *, stream: bool) -> Job:
    tier = Tier.EXTERNAL if deployment == HOSTED else Tier.SMALL
    base = job(f"req_{uuid.uuid4().hex}", "edge1", max_tokens=200)
    plan = RoutePlan(tier=tier, deployments=(deployment,), rule="pin:tier", reason="test")
    return dataclasses.replace(base, plan=plan, stream=stream)


def edge_estimate(the_job: Job) -> int:
    """The number the edge reserved budgets and charged rate limits with."""
    return PromptFeatures.from_messages(the_job.body["messages"]).estimated_prompt_tokens


def content(reply: Reply) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for c in reply.data["choices"])


async def leave_after(executor: Executor, the_job: Job, pieces: int) -> tuple[LedgerEntry, str]:
    """Run a stream whose client goes away after ``pieces`` content chunks, as a worker stops
    it (``abandon``, then cancel its task); the entry and the text the client got."""
    got: list[str] = []

    async def emit(reply: Reply) -> None:
        if reply.kind == "chunk" and reply.data.get("choices") and content(reply):
            got.append(content(reply))
            if len(got) == pieces:
                executor.abandon(the_job.request_id)
                task = asyncio.current_task()
                assert task is not None
                task.cancel()  # lands at the executor's next wait: no further chunk relayed

    entry = await asyncio.create_task(executor.run(the_job, emit))
    return entry, "".join(got)


def only_attempt(entry: LedgerEntry) -> Any:
    (attempt,) = entry.attempts
    return attempt


async def test_a_hosted_stream_whose_client_leaves_is_booked_from_estimates(rig: Rig) -> None:
    the_job = a_job(HOSTED, stream=True)
    entry, text = await leave_after(rig.executor, the_job, 5)
    assert (entry.outcome, entry.status_code) == ("client_disconnected", 499)
    attempt = only_attempt(entry)
    assert attempt.outcome == "cancelled" and attempt.estimated
    assert attempt.prompt_tokens == edge_estimate(the_job) > 0
    assert attempt.completion_tokens == max(5, estimate_tokens(text))
    assert (entry.prompt_tokens, entry.completion_tokens) == (
        attempt.prompt_tokens,
        attempt.completion_tokens,
    )
    cost = to_micro(PRICES[HOSTED].cost(Usage(attempt.prompt_tokens, attempt.completion_tokens)))
    assert entry.cost_micro_usd == cost > 0
    assert entry.estimated_micro_usd == cost and entry.usage_estimated


async def test_a_vllm_stream_whose_client_leaves_keeps_the_backends_counts(rig: Rig) -> None:
    the_job = a_job(MODEL, stream=True)
    entry, _text = await leave_after(rig.executor, the_job, 5)
    assert entry.outcome == "client_disconnected"
    attempt = only_attempt(entry)
    assert attempt.outcome == "cancelled" and not attempt.estimated
    # the simulator's own count, from the usage in its chunks (continuous usage stats)
    messages = [Message(m["role"], m["content"]) for m in the_job.body["messages"]]
    assert attempt.prompt_tokens == prompt_tokens(messages)
    assert 5 <= attempt.completion_tokens <= 6  # the usage rides on the chunk after the text
    assert entry.estimated_micro_usd is None and not entry.usage_estimated


async def test_a_hosted_call_cancelled_while_the_provider_works_books_its_prompt(
    rig: Rig,
) -> None:
    """Non-streamed: the provider has the request (the simulator holds it), the client leaves.
    The prompt is billed; how much it generated is unknown: 0, flagged."""
    await set_faults(rig.hosted, hang=True)
    the_job = a_job(HOSTED, stream=False)
    entry = await cancelled_once_called(rig, the_job)
    attempt = only_attempt(entry)
    assert attempt.outcome == "cancelled" and attempt.estimated
    assert (attempt.prompt_tokens, attempt.completion_tokens) == (edge_estimate(the_job), 0)
    cost = to_micro(PRICES[HOSTED].cost(Usage(edge_estimate(the_job), 0)))
    assert entry.cost_micro_usd == entry.estimated_micro_usd == cost > 0


async def test_a_hosted_call_cancelled_before_it_was_sent_books_nothing(rig: Rig) -> None:
    """The only slot is busy: the second job waits for it and never reaches the provider."""
    await set_faults(rig.hosted, hang=True)
    holder = a_job(HOSTED, stream=False)
    held = asyncio.create_task(rig.executor.run(holder, ignore))
    await until(lambda: rig.hosted.now == 1, 10)
    waiting = a_job(HOSTED, stream=True)
    entry = await cancelled_after(rig.executor, waiting, 0.3)
    attempt = only_attempt(entry)
    assert attempt.outcome == "cancelled" and not attempt.estimated
    assert (attempt.prompt_tokens, attempt.completion_tokens) == (0, 0)
    assert entry.estimated_micro_usd is None
    assert rig.hosted.served == []  # nothing answered yet, the waiting job never arrived
    rig.executor.abandon(holder.request_id)
    held.cancel()
    assert only_attempt(await held).estimated  # the held one was in the provider's hands


async def ignore(_reply: Reply) -> None:
    return None


async def set_faults(sim: CountingSim, **faults: Any) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sim.url}/admin/faults", json=faults) as response,
    ):
        assert response.status == 200, await response.text()


async def cancelled_after(executor: Executor, the_job: Job, delay_s: float) -> LedgerEntry:
    task = asyncio.create_task(executor.run(the_job, ignore))
    await asyncio.sleep(delay_s)
    executor.abandon(the_job.request_id)
    task.cancel()
    return await task


async def cancelled_once_called(rig: Rig, the_job: Job) -> LedgerEntry:
    task = asyncio.create_task(rig.executor.run(the_job, ignore))
    await until(lambda: rig.hosted.now == 1, 10)  # the provider holds the request
    rig.executor.abandon(the_job.request_id)
    task.cancel()
    return await task


def chain_job(*deployments: str) -> Job:
    base = job(f"req_{uuid.uuid4().hex}", "edge1", max_tokens=200)
    plan = RoutePlan(tier=Tier.EXTERNAL, deployments=deployments, rule="pin:tier", reason="test")
    return dataclasses.replace(base, plan=plan, stream=False)


async def test_a_hosted_answer_that_cannot_be_read_is_booked_its_estimated_prompt(
    rig: Rig,
) -> None:
    """The hosted API answers 200 with half a JSON body: it generated (and bills) the answer,
    which litellm cannot read. The attempt is booked the prompt estimate and no completion
    (unknown), flagged; the client gets the 502 every failed chain gets, and the call is not
    retried in place (a retry would be billed again)."""
    await set_faults(rig.hosted, malformed_after_tokens=0)
    the_job = a_job(HOSTED, stream=False)
    replies: list[Reply] = []

    async def keep(reply: Reply) -> None:
        replies.append(reply)

    entry = await rig.executor.run(the_job, keep)
    assert (entry.outcome, entry.status_code) == ("upstream_error", 502)
    attempt = only_attempt(entry)
    assert attempt.outcome == "protocol_error" and attempt.estimated
    assert attempt.error.startswith(f"[{HOSTED}#0] the answer could not be read: not JSON")
    assert attempt.error.endswith("(HTTP 200)") and "Traceback" not in attempt.error
    assert (attempt.prompt_tokens, attempt.completion_tokens) == (edge_estimate(the_job), 0)
    cost = to_micro(PRICES[HOSTED].cost(Usage(edge_estimate(the_job), 0)))
    assert entry.cost_micro_usd == entry.estimated_micro_usd == cost > 0
    assert len(rig.hosted.served) == 1
    (reply,) = replies
    assert reply.kind == "error" and reply.meta.status == 502
    error = reply.data["error"]
    assert (error["type"], error["code"]) == ("api_error", "upstream_error")
    assert f"{HOSTED}: protocol_error" in error["message"]


async def test_an_unreadable_hosted_answer_falls_back_along_the_chain(rig: Rig) -> None:
    await set_faults(rig.hosted, malformed_after_tokens=0)
    the_job = chain_job(HOSTED, MODEL)
    replies: list[Reply] = []

    async def keep(reply: Reply) -> None:
        replies.append(reply)

    entry = await rig.executor.run(the_job, keep)
    assert (entry.outcome, entry.deployment) == ("ok", MODEL)
    unreadable, served = entry.attempts
    assert (unreadable.deployment, unreadable.outcome) == (HOSTED, "protocol_error")
    assert unreadable.estimated and not served.estimated
    assert (unreadable.prompt_tokens, unreadable.completion_tokens) == (edge_estimate(the_job), 0)
    assert served.outcome == "ok" and served.completion_tokens > 0
    estimated = to_micro(PRICES[HOSTED].cost(Usage(unreadable.prompt_tokens, 0)))
    assert entry.estimated_micro_usd == estimated > 0
    assert entry.cost_micro_usd is not None and entry.cost_micro_usd > estimated
    (reply,) = replies
    assert reply.kind == "result" and reply.data["choices"][0]["message"]["content"]


async def test_an_unreadable_vllm_answer_books_nothing(rig: Rig) -> None:
    """Our own GPUs send no invoice: as any failed vLLM call, nothing is estimated."""
    await set_faults(rig.vllm, malformed_after_tokens=0)
    entry = await rig.executor.run(a_job(MODEL, stream=False), ignore)
    attempt = only_attempt(entry)
    assert attempt.outcome == "protocol_error" and not attempt.estimated
    assert (attempt.prompt_tokens, attempt.completion_tokens) == (0, 0)
    assert entry.estimated_micro_usd is None


async def test_a_hosted_stream_whose_first_event_cannot_be_read_is_booked_its_prompt(
    rig: Rig,
) -> None:
    """Streamed: the provider answers 200, then an event that is not JSON, before any chunk.
    Not a request litellm refused: a protocol error, booked like the non-streamed answer, and
    the chain moves on."""
    await set_faults(rig.hosted, malformed_after_tokens=0)
    the_job = dataclasses.replace(chain_job(HOSTED, MODEL), stream=True)
    entry = await rig.executor.run(the_job, ignore)
    assert (entry.outcome, entry.deployment) == ("ok", MODEL)
    unreadable, served = entry.attempts
    assert (unreadable.deployment, unreadable.outcome) == (HOSTED, "protocol_error")
    assert unreadable.estimated and not served.estimated
    assert (unreadable.prompt_tokens, unreadable.completion_tokens) == (edge_estimate(the_job), 0)
    estimated = to_micro(PRICES[HOSTED].cost(Usage(unreadable.prompt_tokens, 0)))
    assert entry.estimated_micro_usd == estimated > 0


async def test_spans_say_which_attempts_and_entries_rest_on_estimates(rig: Rig) -> None:
    """The attempt span carries ``tiergate.usage.estimated``; the job and ledger.write spans
    say the entry rests in part on estimates, and how much of its cost."""
    await set_faults(rig.hosted, malformed_after_tokens=0)
    entry = await rig.executor.run(chain_job(HOSTED, MODEL), ignore)
    written: list[LedgerEntry] = []

    async def write(booked: LedgerEntry) -> str:
        written.append(booked)
        return "stream"

    await rig.tracing.ledger_write(entry, write)
    assert written == [entry]
    spans = rig.spans.get_finished_spans()
    attempts = {
        str(s.attributes["gen_ai.request.model"]): dict(s.attributes)
        for s in spans
        if s.name == "backend.attempt" and s.attributes
    }
    assert attempts[HOSTED]["tiergate.usage.estimated"] is True
    assert attempts[HOSTED]["tiergate.outcome"] == "protocol_error"
    assert attempts[HOSTED]["gen_ai.usage.input_tokens"] == entry.attempts[0].prompt_tokens
    assert attempts[MODEL]["tiergate.usage.estimated"] is False
    (job_span,) = [s for s in spans if s.name == "job"]
    assert dict(job_span.attributes or {})["tiergate.usage.estimated"] is True
    (ledger_span,) = [s for s in spans if s.name == "ledger.write"]
    booked = dict(ledger_span.attributes or {})
    assert booked["tiergate.usage.estimated"] is True
    assert entry.estimated_micro_usd is not None and entry.estimated_micro_usd > 0
    assert Decimal(str(booked["tiergate.estimated_cost_usd"])) == Decimal(
        entry.estimated_micro_usd
    ).scaleb(-6)
    assert booked["tiergate.ledger.sink"] == "stream"
