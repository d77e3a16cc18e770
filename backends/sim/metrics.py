"""``/metrics``: the vLLM metrics a router reads, under vLLM's names, labels and buckets.

Exposed (labels ``model_name`` and ``engine="0"``, as vLLM's v1 logger does):

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  (read from the engine at scrape time);
* counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:request_success_total{finished_reason=stop|length|abort}``, and the prefix cache's
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (in tokens: the hit rate
  is hits over queries; both stay 0 with caching off);
* ``vllm:cache_config_info`` (value 1; labels ``block_size``, ``num_gpu_blocks``,
  ``enable_prefix_caching`` and ``engine``, as vLLM's info gauge, without ``model_name``);
* histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` and
  ``vllm:e2e_request_latency_seconds`` with the bucket bounds of ``vllm/v1/metrics/loggers.py``.

Latencies are wall-clock, so at ``time_scale`` s they are s times the profile's figures, as a
client measures them. Values are kept as plain numbers in a ``SimMetrics`` (one event loop, no
locks) and rendered by a collector registered in the app's own ``CollectorRegistry``, which keeps
per-token observations cheap: a burst of k tokens is one bucket update with weight k.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from backends.sim.engine import SimEngine

__all__ = ["FastHistogram", "SimMetrics", "make_registry", "render_metrics"]

_TTFT = (
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
_ITL = "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80"
_E2E = "0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680"
TTFT_BUCKETS = tuple(float(b) for b in _TTFT.split())
ITL_BUCKETS = tuple(float(b) for b in _ITL.split())
E2E_BUCKETS = tuple(float(b) for b in _E2E.split())


class FastHistogram:
    """A histogram that takes weighted observations; ``le`` bounds are inclusive."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        if weight <= 0:
            return
        self.counts[bisect_left(self.bounds, value)] += weight
        self.total += value * weight

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class SimMetrics:
    """Counters and histograms of one simulated engine."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: Counter[str] = Counter()
        self.ttft = FastHistogram(TTFT_BUCKETS)
        self.itl = FastHistogram(ITL_BUCKETS)
        self.e2e = FastHistogram(E2E_BUCKETS)


class _Collector(Collector):
    def __init__(self, model_name: str, engine: SimEngine, metrics: SimMetrics) -> None:
        self._labels = ["model_name", "engine"]
        self._values = [model_name, "0"]
        self._engine = engine
        self._metrics = metrics

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=self._labels)
        family.add_metric(self._values, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=self._labels)
        family.add_metric(self._values, value)
        return family

    def _histogram(self, name: str, doc: str, hist: FastHistogram) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=self._labels)
        family.add_metric(self._values, buckets=hist.cumulative(), sum_value=hist.total)
        return family

    def _cache_config(self) -> GaugeMetricFamily:
        cache = self._engine.cache
        labels = {
            "block_size": str(cache.block_size),
            "num_gpu_blocks": str(cache.num_blocks),
            "enable_prefix_caching": str(cache.enabled),
            "engine": "0",
        }
        family = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine.", labels=list(labels)
        )
        family.add_metric(list(labels.values()), 1.0)
        return family

    def collect(self) -> Iterator[Metric]:
        e, m = self._engine, self._metrics
        for name, doc, value in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                e.running,
            ),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage),
        ):
            yield self._gauge(name, doc, value)
        yield self._cache_config()
        for name, doc, value in (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                m.generation_tokens,
            ),
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                e.cache.queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                e.cache.hits,
            ),
        ):
            yield self._counter(name, doc, value)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self._labels, "finished_reason"],
        )
        for reason in ("stop", "length", "abort"):
            success.add_metric([*self._values, reason], m.success[reason])
        yield success
        for name, doc, hist in (
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                m.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                m.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                m.e2e,
            ),
        ):
            yield self._histogram(name, doc, hist)


def make_registry(model_name: str, engine: SimEngine, metrics: SimMetrics) -> CollectorRegistry:
    """A fresh registry (never the global default) exposing ``engine`` and ``metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(model_name, engine, metrics))
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
