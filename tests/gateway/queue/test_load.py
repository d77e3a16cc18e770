"""Load-aware replica choice from the replicas' live vLLM metrics (simulators over HTTP)."""

from __future__ import annotations

import asyncio

import aiohttp

from backends.openai_http import VLLMBackend
from gateway.queue.replicas.load import LoadScraper, metrics_url, parse_load
from gateway.queue.replicas.pool import Replica
from tests.gateway.queue.conftest import MODEL
from tests.support import free_port


def test_old_and_new_metric_names() -> None:
    new = "vllm:num_requests_waiting 3\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"
    old = "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.25\n"
    a, b = parse_load(new, 1.0), parse_load(old, 1.0)
    assert (a.waiting, a.running, a.kv_usage) == (3.0, 2.0, 0.5)
    assert (b.waiting, b.running, b.kv_usage) == (1.0, 0.0, 0.25)


def test_a_full_page_reads_only_the_load_metrics_summed_over_labels() -> None:
    """As vLLM writes it: HELP and TYPE lines, labelled samples (one per engine, summed), look-alike
    names that are other metrics, and histograms around them."""
    page = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 1.0',
            "# TYPE vllm:num_requests_waiting_by_reason gauge",
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0',
            'vllm:num_requests_running{engine="0",model_name="m"} 7.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75',
            *(
                f'vllm:e2e_request_latency_seconds_bucket{{le="{b}",model_name="m"}} {i}'
                for i, b in enumerate(("0.3", "0.5", "1.0", "+Inf"))
            ),
            "vllm:e2e_request_latency_seconds_count 3.0",
            "",
        ]
    )
    load = parse_load(page, 2.0)
    assert (load.waiting, load.running, load.kv_usage, load.at) == (5.0, 7.0, 0.75, 2.0)


async def test_busy_ranks_last_and_stale_is_skipped(start_sim) -> None:  # type: ignore[no-untyped-def]
    busy, idle = await start_sim(1, itl_s=0.2), await start_sim(1)
    gone = f"http://127.0.0.1:{free_port()}"  # answers nothing: never fresh
    async with aiohttp.ClientSession() as session:
        replicas = [
            Replica(VLLMBackend(name=f"{MODEL}#{i}", base_url=url, session=session), 1)
            for i, url in enumerate((busy.url, idle.url, gone))
        ]
        urls = {
            r.backend.name: metrics_url(u)
            for r, u in zip(replicas, (busy.url, idle.url, gone), strict=True)
        }
        scraper = LoadScraper(session, urls, every_s=0.1, stale_s=0.5)
        assert scraper.rank(MODEL, replicas)[0].backend.name.endswith("#0")  # no data yet
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 30}
        held = [
            asyncio.create_task(session.post(f"{busy.url}/v1/chat/completions", json=body))
            for _ in range(2)
        ]  # busy: one running (capacity 1), one waiting
        await asyncio.sleep(0.3)
        await scraper.scrape()
        names = [r.backend.name for r in scraper.rank(MODEL, replicas)]
        assert names == [f"{MODEL}#1", f"{MODEL}#0"]  # idle first, busy next, stale skipped
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
