"""SIGTERM under load: an edge and a worker stop while requests run, and every request ends with
one answer its ledger row agrees with.

Real processes: a simulator (50 ms a token), two edges (``serve --no-workers``),
two workers, Redis, SQLite. Edge A (``server.drain_s: 3``) and worker A
(``queue.worker_drain_s: 3``) get SIGTERM one second into the load; edge B and worker B live on.

- edge A: short requests (~2 s) it holds finish (200); long ones it cannot finish within its drain
  are answered 503 ``shutting_down`` (OpenAI-shaped JSON, never uvicorn's plain-text 500), a
  started stream ends with an error event; each booked as answered. New connections are refused.
- worker A: short jobs finish within its drain; long ones are handed back and finished by
  worker B (answered 200 through edge B; a stream already under way ends with an error event,
  as any stream whose worker stops: never started over).

Slow: a handed-back job is taken over once its entry has been idle 15 s.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.support import (
    TEST_KEYS,
    Proc,
    drop_prefix,
    free_port,
    gateway_config,
    new_prefix,
    own_config,
    start_sim,
    start_tiergate,
    wait_ready,
)
from tests.support.ledger import wait_entry

SMALL = "llama-3.1-8b-instruct"
PROMPT = "Explain how a circuit breaker protects a distributed system, in detail."
SHORT, LONG = 40, 1000  # tokens: ~2 s, and the prompt's whole answer (221 tokens, ~11 s)
DRAIN_S = 3.0


def _own_config(config: Path, workdir: Path, name: str, **sections: dict[str, object]) -> Path:
    """``config`` with its own admin (and public) port and the given setting overrides."""
    server = {"admin_port": free_port(), "port": free_port(), **sections.pop("server", {})}
    return own_config(config, workdir, name, server=server, **sections)


def _base(config: Path) -> str:
    return f"http://127.0.0.1:{yaml.safe_load(config.read_text())['server']['port']}"


def _admin(config: Path) -> str:
    return f"http://127.0.0.1:{yaml.safe_load(config.read_text())['server']['admin_port']}"


@dataclass
class Stack:
    edges: tuple[Proc, Proc]
    edge_urls: tuple[str, str]
    workers: tuple[Proc, Proc]
    database_url: str
    sim_metrics: str
    admin_urls: tuple[str, str]
    """Edge A's and worker A's admin ports (health and metrics)."""


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    prefix = new_prefix()
    sim_port = free_port()
    sim, _ = start_sim(SMALL, sim_port, tmp_path, extra_args=("--itl-ms", "50"))
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    config = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=prefix,
        database_url=database_url,
        sim_ports={SMALL: sim_port},
        port=free_port(),
        admin_port=free_port(),
    )
    edge_a = _own_config(config, tmp_path, "edge-a", server={"drain_s": DRAIN_S})
    edge_b = _own_config(config, tmp_path, "edge-b")
    worker_a = _own_config(config, tmp_path, "worker-a", queue={"worker_drain_s": DRAIN_S})
    worker_b = _own_config(config, tmp_path, "worker-b")
    procs = [
        start_tiergate("serve", edge_a, tmp_path, "edge-a", "--no-workers"),
        start_tiergate("serve", edge_b, tmp_path, "edge-b", "--no-workers"),
        start_tiergate("worker", worker_a, tmp_path, "worker-a"),
        start_tiergate("worker", worker_b, tmp_path, "worker-b"),
    ]
    try:
        for proc, path in zip(procs[:2], (edge_a, edge_b), strict=True):
            wait_ready(proc, f"{_base(path)}/readyz")
        yield Stack(
            edges=(procs[0], procs[1]),
            edge_urls=(_base(edge_a), _base(edge_b)),
            workers=(procs[2], procs[3]),
            database_url=database_url,
            sim_metrics=f"http://127.0.0.1:{sim_port}/metrics",
            admin_urls=(_admin(edge_a), _admin(worker_a)),
        )
    finally:
        for proc in procs:
            proc.stop(timeout_s=30)
        sim.stop()
        drop_prefix(redis_url, prefix)


@dataclass
class Outcome:
    """What one client saw: its request id, the HTTP status, and for a stream whether it ended
    with an error event."""

    request_id: str
    status: int
    code: str | None = None
    stream_error: bool = False
    content_type: str = ""


async def _call(base: str, max_tokens: int, *, stream: bool) -> Outcome:
    async with openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key=TEST_KEYS["TIERGATE_KEY_ACME"], max_retries=0, timeout=90
    ) as client:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=SMALL,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=max_tokens,
                stream=stream,
                extra_headers={"x-tiergate-timeout-ms": "80000"},
            )
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            return Outcome(
                exc.response.headers.get("x-request-id", ""),
                exc.status_code,
                code=body.get("code"),
                content_type=exc.response.headers.get("content-type", ""),
            )
        outcome = Outcome(raw.headers["x-request-id"], raw.status_code)
        if stream:
            try:
                async for _chunk in raw.parse():
                    pass
            except openai.APIError:
                outcome.stream_error = True
        else:
            raw.parse()
        return outcome


async def _running(metrics_url: str, n: int) -> None:
    """Wait until the simulator runs ``n`` requests."""
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            text = (await http.get(metrics_url)).text
            running = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running")]
            if running and float(running[0].split()[-1]) >= n:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the simulator never ran {n} requests")


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_sigterm_under_load_finishes_or_answers_every_request(stack: Stack) -> None:
    edge_a, edge_b = stack.edge_urls
    calls = [
        *(_call(edge_a, SHORT, stream=False) for _ in range(6)),
        *(_call(edge_a, LONG, stream=False) for _ in range(6)),
        *(_call(edge_a, LONG, stream=True) for _ in range(3)),
        *(_call(edge_b, SHORT, stream=False) for _ in range(6)),
        *(_call(edge_b, LONG, stream=False) for _ in range(8)),
        *(_call(edge_b, LONG, stream=True) for _ in range(3)),
    ]
    tasks = [asyncio.create_task(c) for c in calls]
    await _running(stack.sim_metrics, len(calls) - 4)  # in flight: 32 slots, the rest queued
    stack.edges[0].popen.send_signal(signal.SIGTERM)
    stack.workers[0].popen.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    await asyncio.sleep(0.5)
    with pytest.raises(openai.APIConnectionError):  # edge A accepts no new connection
        await _call(edge_a, SHORT, stream=False)
    # Their admin ports still answer health and metrics during the drain (Kubernetes' liveness
    # probe and the scrape that feeds autoscaling); before, they closed at the signal.
    async with httpx.AsyncClient(timeout=5) as http:
        for admin in stack.admin_urls:
            assert (await http.get(f"{admin}/healthz")).status_code == 200, admin
            assert (await http.get(f"{admin}/metrics")).status_code == 200, admin
    # Both stop within their drain (plus the time to answer, hand back and close), cleanly.
    for proc in (stack.edges[0], stack.workers[0]):
        assert await asyncio.to_thread(proc.popen.wait, 30) == 0, proc.output()
    assert time.monotonic() - signalled < DRAIN_S + 10
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert not failed, [i for i, _ in failed]
    outcomes = [r for r in results if isinstance(r, Outcome)]
    assert "Exception in ASGI application" not in stack.edges[0].output()

    a, b = outcomes[:15], outcomes[15:]
    assert [o.status for o in a[:6]] == [200] * 6  # in flight, short: finished
    for o in a[6:12]:  # long, not finished within the drain: an OpenAI-shaped 503
        assert (o.status, o.code, o.content_type) == (503, "shutting_down", "application/json")
    for o in a[12:]:  # a started stream: an error event, never a clean end
        assert (o.status, o.stream_error) == (200, True)
    # Edge B's requests all finish: worker A's long jobs were handed back, worker B ran them;
    # a stream handed back mid-way is not started over but ends with an error event.
    assert [(o.status, o.stream_error) for o in b[:14]] == [(200, False)] * 14
    assert [o.status for o in b[14:]] == [200] * 3

    for o in outcomes:  # each row says what its client got
        entry = await wait_entry(stack.database_url, o.request_id, timeout_s=30)
        if o.stream_error:
            assert (entry.status_code, entry.outcome) == (200, "stream_error"), entry
        elif o.status == 200:
            assert (entry.status_code, entry.outcome) == (200, "ok"), entry
        else:
            assert (entry.status_code, entry.outcome) == (503, "shutting_down"), entry
