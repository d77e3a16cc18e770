"""Scale-out: two edges (`tiergate serve --no-workers`) and two workers (`tiergate worker`) on one
Redis, one simulator replica whose capacity in the config is 4 (the simulator itself would take
32). One worker is SIGKILLed mid-run. Every request gets exactly one status and one ledger row,
and the replica never holds more than 4 requests from tiergate. Slow: the dead worker's jobs
are reclaimed after their entries go idle (15 s)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import (
    TEST_KEYS,
    Proc,
    drop_prefix,
    free_port,
    gateway_config,
    new_prefix,
    own_config,
    start_gateway,
    start_sim,
    start_worker,
    wait_ready,
)
from tests.support.ledger import wait_entry

SMALL = "llama-3.1-8b-instruct"
CAPACITY = 4
REQUESTS = 48
GLOBEX_RPM = 10


def _running(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=2).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:num_requests_running":
            return sum(s.value for s in family.samples)
    return 0.0


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str) -> Iterator[dict[str, object]]:
    prefix = new_prefix()
    sim_port = free_port()
    sim, _ = start_sim(SMALL, sim_port, tmp_path, time_scale=1.0)
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    ports = [free_port(), free_port()]
    config = gateway_config(
        workdir=tmp_path, redis_url=redis_url, prefix=prefix, database_url=database_url,
        sim_ports={SMALL: sim_port}, port=ports[0], admin_port=free_port(),
    )  # fmt: skip
    data = yaml.safe_load(config.read_text())
    data["deployments"][0]["replicas"][0]["max_num_seqs"] = CAPACITY
    data["tenants"]["globex"]["requests_per_minute"] = GLOBEX_RPM  # a limit both edges share
    config.write_text(yaml.safe_dump(data))
    procs: list[Proc] = []
    try:
        for i, port in enumerate(ports):
            own = own_config(
                config, tmp_path, f"edge-{i}", server={"port": port, "admin_port": free_port()}
            )
            procs.append(start_gateway(own, tmp_path, "--no-workers", name=f"edge-{i}"))
        workers = [start_worker(config, tmp_path, f"worker-{i}") for i in range(2)]
        procs.extend(workers)
        for i, port in enumerate(ports):
            wait_ready(procs[i], f"http://127.0.0.1:{port}/readyz")
        yield {
            "urls": [f"http://127.0.0.1:{p}/v1" for p in ports],
            "workers": workers,
            "database_url": database_url,
            "sim_metrics": f"http://127.0.0.1:{sim_port}/metrics",
            "redis_url": redis_url,
            "prefix": prefix,
        }
    finally:
        for proc in procs:
            proc.stop()
        sim.stop()
        drop_prefix(redis_url, prefix)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_two_edges_two_workers_one_killed(cluster: dict[str, object]) -> None:
    urls: list[str] = cluster["urls"]  # type: ignore[assignment]
    workers: list[Proc] = cluster["workers"]  # type: ignore[assignment]
    clients = [
        openai.AsyncOpenAI(base_url=u, api_key=TEST_KEYS["TIERGATE_KEY_ACME"], max_retries=0)
        for u in urls
    ]
    statuses: dict[str, int] = {}
    peak = 0.0
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            running = await asyncio.to_thread(_running, str(cluster["sim_metrics"]))
            peak = max(peak, running)
            await asyncio.sleep(0.05)

    async def one(i: int) -> None:
        client = clients[i % 2]
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=SMALL,
                messages=[{"role": "user", "content": f"Tell me about request {i}."}],
                max_tokens=60,
                extra_headers={"x-tiergate-timeout-ms": "90000"},
            )
            statuses[raw.headers["x-request-id"]] = raw.http_response.status_code
        except openai.APIStatusError as exc:
            statuses[exc.response.headers.get("x-request-id", f"none-{i}")] = exc.status_code

    watcher = asyncio.create_task(watch())
    calls = []
    for i in range(REQUESTS):  # arrivals over ~1 s (a cold edge's Redis pool under one
        calls.append(asyncio.create_task(one(i)))  # instant burst can fail fast: 503)
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)
    workers[0].popen.kill()  # mid-run: it holds up to CAPACITY jobs
    workers[0].popen.wait()
    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*calls), 150)
    stop.set()
    await watcher
    for client in clients:
        await client.close()

    assert len(statuses) == REQUESTS, statuses  # every request has exactly one status
    assert Counter(statuses.values()) == Counter({200: REQUESTS}), statuses
    assert 1 <= peak <= CAPACITY
    assert time.monotonic() - started < 120
    # Whether the kill caught jobs in flight depends on timing (on a loaded CI machine the
    # survivor may hold them all); reclaiming an orphan is asserted deterministically by
    # tests/gateway/queue/test_recovery.py. Here: whatever the kill hit, nothing was lost.
    for request_id in statuses:
        entry = await wait_entry(str(cluster["database_url"]), request_id, timeout_s=30)
        assert entry.outcome == "ok"


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_rate_limit_holds_across_both_edges(cluster: dict[str, object]) -> None:
    urls: list[str] = cluster["urls"]  # type: ignore[assignment]
    clients = [
        openai.AsyncOpenAI(base_url=u, api_key=TEST_KEYS["TIERGATE_KEY_GLOBEX"], max_retries=0)
        for u in urls
    ]
    outcomes: dict[str, tuple[int, str | None]] = {}

    async def one(i: int) -> None:
        try:
            raw = await clients[i % 2].chat.completions.with_raw_response.create(
                model=SMALL, messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=5
            )
            outcomes[raw.headers["x-request-id"]] = (200, None)
        except openai.APIStatusError as exc:
            retry_after = exc.response.headers.get("retry-after")
            outcomes[exc.response.headers["x-request-id"]] = (exc.status_code, retry_after)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(3 * GLOBEX_RPM)))
    elapsed = time.monotonic() - started
    for client in clients:
        await client.close()

    assert len(outcomes) == 3 * GLOBEX_RPM  # every request one status
    answered = [rid for rid, (status, _) in outcomes.items() if status == 200]
    refused = {rid: ra for rid, (status, ra) in outcomes.items() if status == 429}
    assert len(answered) + len(refused) == len(outcomes)
    # One bucket for the tenant, whichever edge a request reached: a minute's allowance, plus
    # what refilled (one request every 60 / GLOBEX_RPM s) while the burst lasted.
    refill = int(elapsed * GLOBEX_RPM / 60)
    assert GLOBEX_RPM <= len(answered) <= GLOBEX_RPM + refill, (len(answered), elapsed)
    assert all(ra is not None and int(ra) >= 1 for ra in refused.values())
    for request_id in refused:
        entry = await wait_entry(str(cluster["database_url"]), request_id, timeout_s=30)
        assert entry.status_code == 429 and entry.outcome == "rate_limit_exceeded"
    for request_id in answered:
        entry = await wait_entry(str(cluster["database_url"]), request_id, timeout_s=30)
        assert entry.outcome == "ok"
