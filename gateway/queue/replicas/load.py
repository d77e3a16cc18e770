"""Load-aware replica choice: each replica's vLLM ``/metrics``, scraped in the background.

Every ``every_s`` (1.5 s) each worker process reads ``vllm:num_requests_waiting``,
``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` (older vLLM:
``vllm:gpu_cache_usage_perc``; ``vllm_``-prefixed spellings too) of every vLLM replica. ``rank``
orders a deployment's replicas for the pool: replicas whose last good scrape is older than
``stale_s`` count as busy and are skipped while a fresh one exists (a replica failing its
``/metrics`` is usually failing health too); the rest by waiting requests, then by
``(running + our in-flight) / capacity``, then by KV-cache use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.loops import Loop
from gateway.queue.replicas.pool import Replica

__all__ = ["LoadScraper", "ReplicaLoad", "metrics_url", "parse_load"]

log = logging.getLogger(__name__)

_WAITING = ("vllm:num_requests_waiting", "vllm_num_requests_waiting")
_RUNNING = ("vllm:num_requests_running", "vllm_num_requests_running")
_KV = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm_kv_cache_usage_perc",
    "vllm_gpu_cache_usage_perc",
)


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    at: float = 0.0
    """``time.monotonic()`` of the scrape."""


def metrics_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return (base.removesuffix("/v1") or base) + "/metrics"


_SAMPLE_PREFIXES = tuple(f"{name}{sep}" for name in (*_WAITING, *_RUNNING, *_KV) for sep in "{ ")
"""A sample line of a metric ``parse_load`` reads starts with its name and ``{`` or a space."""


def parse_load(text: str, at: float) -> ReplicaLoad:
    """The load figures of one ``/metrics`` page. Only the lines of the metrics read here go to
    the parser: a vLLM page holds hundreds of histogram lines, and prometheus_client's parser
    (pure Python, run on the event loop) took about 10 µs a line."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_SAMPLE_PREFIXES))
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)

    def first(names: tuple[str, ...]) -> float:
        return next((values[n] for n in names if n in values), 0.0)

    return ReplicaLoad(first(_WAITING), first(_RUNNING), first(_KV), at)


class LoadScraper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Mapping[str, str],
        *,
        every_s: float = 1.5,
        stale_s: float = 5.0,
    ) -> None:
        """``urls``: metrics URL of each replica, by its backend name."""
        self._session = session
        self._urls = dict(urls)
        self._stale_s = stale_s
        self._timeout = aiohttp.ClientTimeout(total=max(every_s, 0.5))
        self._loads: dict[str, ReplicaLoad] = {}
        self._loop = Loop("tiergate-load-scraper", self.scrape, every_s=every_s)

    def set_urls(self, urls: Mapping[str, str]) -> None:
        """The replicas to scrape from now on (replicas joined or left); a replica that left
        is forgotten."""
        self._urls = dict(urls)
        self._loads = {n: v for n, v in self._loads.items() if n in self._urls}

    def load(self, name: str) -> ReplicaLoad | None:
        return self._loads.get(name)

    def fresh(self, name: str) -> bool:
        load = self._loads.get(name)
        return load is not None and time.monotonic() - load.at <= self._stale_s

    def rank(self, deployment: str, group: Sequence[Replica]) -> list[Replica]:
        scraped = [r for r in group if r.backend.name in self._urls]
        if not scraped:  # not vLLM (a hosted API): our own count only
            return sorted(group, key=lambda r: r.load)
        fresh = [r for r in group if self.fresh(r.backend.name)]
        candidates = fresh or list(group)  # stale = busy: skipped while a fresh one exists

        def key(r: Replica) -> tuple[float, float, float]:
            load = self._loads.get(r.backend.name) or ReplicaLoad()
            return (load.waiting, (load.running + r.inflight) / r.capacity, load.kv_usage)

        return sorted(candidates, key=key)

    async def scrape(self) -> None:
        await asyncio.gather(*(self._one(n, u) for n, u in list(self._urls.items())))

    async def _one(self, name: str, url: str) -> None:
        try:
            async with self._session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return
                text = await resp.text()
            if name in self._urls:  # not one that left meanwhile
                self._loads[name] = parse_load(text, time.monotonic())
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.debug("cannot scrape %s: %s", url, type(exc).__name__)

    def start(self) -> None:
        self._loop.start()  # discovered replicas may join later

    async def aclose(self) -> None:
        await self._loop.aclose()
