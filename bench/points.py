"""One point of the overhead bench: the same load sent in short blocks, in turn, to a simulator
directly and to one or more gateways in front of it, and what those blocks add up to (the JSON
of ``bench/results/overhead.json`` and ``compare.json``). Used by ``bench.overhead`` (one
gateway, tiergate) and ``bench.compare`` (tiergate and LiteLLM's proxy, in the same run).

- ``measure_point``: warm every target up, then alternate blocks between them, reading every
  gateway's CPU time around every block;
- ``json_point`` / ``stream_point``: the direct blocks against one gateway's, as percentiles,
  the difference (what the gateway adds) and the gateway's CPU per answer;
- ``scrape`` / ``histogram_delta``: a gateway's own Prometheus histograms over the point.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.loadgen import Block, StreamBlock, Target, new_session, pct

__all__ = [
    "METRICS",
    "Gateway",
    "Measured",
    "RunBlock",
    "dist_ms",
    "json_point",
    "measure_point",
    "ms",
    "proc_cpu_s",
    "proc_rss_mb",
    "stream_point",
]

METRICS = (
    "tiergate_overhead_seconds",
    "tiergate_route_decision_seconds",
    "tiergate_queue_wait_seconds",
    "tiergate_request_duration_seconds",
    "tiergate_time_to_first_token_seconds",
    "tiergate_inter_token_latency_seconds",
)


# --- processes ----------------------------------------------------------------------------


def proc_cpu_s(pid: int | None) -> float | None:
    """utime + stime of ``pid`` (all its threads), seconds."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class Gateway:
    """A gateway under test: the target that sends to it (named after the gateway) and, when
    known, its process (CPU, memory) and its Prometheus page."""

    target: Target
    pid: int | None
    metrics_url: str | None = None

    @property
    def name(self) -> str:
        return self.target.name


# --- metrics ------------------------------------------------------------------------------


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0


async def scrape(http: aiohttp.ClientSession, url: str | None) -> dict[str, Histogram]:
    """The histograms of ``METRICS`` on a Prometheus ``/metrics`` page, summed over labels."""
    from prometheus_client.parser import text_string_to_metric_families

    if url is None:
        return {}
    try:
        async with http.get(url) as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return {}
    out: dict[str, Histogram] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in METRICS:
            continue
        hist = out.setdefault(family.name, Histogram())
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                hist.buckets[le] = hist.buckets.get(le, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                hist.total += sample.value
            elif sample.name.endswith("_count"):
                hist.count += sample.value
    return out


def histogram_delta(before: dict[str, Histogram], after: dict[str, Histogram]) -> dict[str, Any]:
    """Per histogram over the point: count, mean, and the bucket bounds p50 and p99 fall under."""
    out: dict[str, Any] = {}
    for name, late in after.items():
        early = before.get(name, Histogram())
        count = late.count - early.count
        if count <= 0:
            continue
        buckets = sorted((le, n - early.buckets.get(le, 0.0)) for le, n in late.buckets.items())

        def under(q: float, buckets: list[tuple[float, float]] = buckets, n: float = count) -> Any:
            le = next(le for le, seen in buckets if seen >= q * n)
            return None if le == float("inf") else round(le * 1000, 3)

        out[name] = {
            "count": int(count),
            "mean_ms": round((late.total - early.total) / count * 1000, 3),
            "p50_ms_at_most": under(0.5),
            "p99_ms_at_most": under(0.99),
        }
    return out


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Measured:
    block: Any
    """A ``Block`` or a ``StreamBlock``."""
    gateway_cpu_s: dict[str, float | None]
    """Every gateway's CPU time during the block, by name (``None``: its process is unknown)."""
    load_cpu_pct: float


RunBlock = Callable[[aiohttp.ClientSession, Target, float], Awaitable[Any]]


def block_order(targets: Sequence[Target], blocks: int) -> list[Target]:
    """``blocks`` rounds over ``targets``, every other one backwards: A B C C B A A B C ... (with
    two, ABBA), so a drift in the machine falls on every target alike."""
    order: list[Target] = []
    for i in range(blocks):
        order += targets if i % 2 == 0 else targets[::-1]
    return order


def _minus(end: float | None, start: float | None) -> float | None:
    return None if end is None or start is None else end - start


async def measure_point(
    direct: Target,
    gateways: Sequence[Gateway],
    connections: int,
    run: RunBlock,
    *,
    warmup_s: float,
    point_s: float,
    block_s: float,
) -> tuple[list[Measured], dict[str, dict[str, Any]]]:
    """Warm every target up, then ``point_s`` of blocks each, alternating (``block_order``),
    reading every gateway's CPU time around every block. Also every gateway's histograms over
    the point, by name (empty without a metrics page)."""
    targets = [direct, *(g.target for g in gateways)]
    blocks = max(1, round(point_s / block_s))
    async with contextlib.AsyncExitStack() as stack:
        sessions = {
            t.name: await stack.enter_async_context(new_session(connections)) for t in targets
        }
        http = await stack.enter_async_context(aiohttp.ClientSession())
        for target in targets:
            await run(sessions[target.name], target, warmup_s)
        before = {g.name: await scrape(http, g.metrics_url) for g in gateways}
        measured: list[Measured] = []
        for target in block_order(targets, blocks):
            cpu0 = {g.name: proc_cpu_s(g.pid) for g in gateways}
            load0, wall0 = time.process_time(), time.perf_counter()
            block = await run(sessions[target.name], target, block_s)
            cpu1 = {g.name: proc_cpu_s(g.pid) for g in gateways}
            load1, wall1 = time.process_time(), time.perf_counter()
            cpu = {name: _minus(cpu1[name], start) for name, start in cpu0.items()}
            measured.append(Measured(block, cpu, 100 * (load1 - load0) / (wall1 - wall0)))
        after = {g.name: await scrape(http, g.metrics_url) for g in gateways}
    return measured, {g.name: histogram_delta(before[g.name], after[g.name]) for g in gateways}


# --- what a point adds up to --------------------------------------------------------------


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def dist_ms(values_s: list[float]) -> dict[str, float | None]:
    return {
        "p50": ms(pct(values_s, 0.5)),
        "p90": ms(pct(values_s, 0.9)),
        "p99": ms(pct(values_s, 0.99)),
        "max": ms(max(values_s, default=None)),
        "mean": ms(sum(values_s) / len(values_s)) if values_s else None,
    }


def _errors(measured: Sequence[Measured]) -> dict[str, int]:
    total: dict[str, int] = {}
    for m in measured:
        for kind, n in m.block.errors.items():
            total[kind] = total.get(kind, 0) + n
    return total


def _stages(blocks: Sequence[Block | StreamBlock]) -> dict[str, dict[str, float | None]] | None:
    merged: dict[str, list[float]] = {}
    for block in blocks:
        for name, values in block.stages_ms.items():
            merged.setdefault(name, []).extend(values)
    if not merged:
        return None
    return {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for name, v in merged.items()}


def _side(measured: Sequence[Measured], gateway: str) -> dict[str, Any]:
    """What one target's blocks of a point add up to (shared by JSON and streamed blocks), with
    ``gateway``'s CPU during them."""
    ok = sum(m.block.ok for m in measured)
    wall = sum(m.block.wall_s for m in measured)
    cpus = [m.gateway_cpu_s.get(gateway) for m in measured]
    side: dict[str, Any] = {
        "sent": sum(m.block.sent for m in measured),
        "ok": ok,
        "errors": _errors(measured),
        "wall_s": round(wall, 3),
        "throughput_rps": round(ok / wall, 1) if wall else None,
        "load_generator_cpu_pct_max": round(max(m.load_cpu_pct for m in measured), 1),
    }
    if None not in cpus:
        cpu = sum(c for c in cpus if c is not None)
        side["gateway_cpu_s"] = round(cpu, 3)
        side["gateway_cpu_pct"] = round(100 * cpu / wall, 1) if wall else None
    return side


def _gateway_cpu(point: dict[str, Any], unit: str) -> None:
    """CPU per answer while loaded, raw and less the idle rate seen during the direct blocks."""
    direct, through = point["direct"], point["through"]
    if "gateway_cpu_s" not in through or not through["ok"]:
        return
    idle_rate = direct["gateway_cpu_s"] / direct["wall_s"] if direct["wall_s"] else 0.0
    cpu, n = through["gateway_cpu_s"], through["ok"]
    point["gateway_idle_cpu_pct"] = round(100 * idle_rate, 2)
    point[f"gateway_cpu_ms_per_{unit}"] = round(1000 * cpu / n, 3)
    net = cpu - idle_rate * through["wall_s"]
    point[f"gateway_cpu_ms_per_{unit}_net_of_idle"] = round(1000 * net / n, 3)


def _sides(measured: Sequence[Measured], gateway: str) -> dict[str, list[Measured]]:
    """The direct blocks and ``gateway``'s, the latter under the name ``through``."""
    return {
        "direct": [m for m in measured if m.block.target == "direct"],
        "through": [m for m in measured if m.block.target == gateway],
    }


def json_point(measured: list[Measured], gateway: str = "through") -> dict[str, Any]:
    """The direct blocks against ``gateway``'s (its side of the point is ``through``)."""
    point: dict[str, Any] = {}
    for name, mine in _sides(measured, gateway).items():
        side = _side(mine, gateway)
        side["latency_ms"] = dist_ms([x for m in mine for x in m.block.latencies_s])
        if name == "through":
            side["server_timing_ms"] = _stages([m.block for m in mine])
            own = [x / 1000 for m in mine for x in m.block.overhead_header_ms]
            side["x_tiergate_overhead_ms"] = dist_ms(own) if own else None
        side["blocks"] = [
            {"ok": m.block.ok, "p50_ms": ms(pct(m.block.latencies_s, 0.5)),
             "p99_ms": ms(pct(m.block.latencies_s, 0.99)),
             "gateway_cpu_s": m.gateway_cpu_s.get(gateway)}
            for m in mine
        ]  # fmt: skip
        point[name] = side
    point["added_latency_ms"] = _added(point, "latency_ms")
    _gateway_cpu(point, "request")
    return point


def _added(point: dict[str, Any], key: str) -> dict[str, float | None]:
    through, direct = point["through"][key], point["direct"][key]
    return {
        q: None if through[q] is None or direct[q] is None else round(through[q] - direct[q], 3)
        for q in ("p50", "p90", "p99")
    }


def stream_point(
    measured: list[Measured], itl_s: float, gateway: str = "through"
) -> dict[str, Any]:
    """The direct streams against ``gateway``'s (its side of the point is ``through``)."""
    point: dict[str, Any] = {}
    for name, mine in _sides(measured, gateway).items():
        side = _side(mine, gateway)
        side["ttft_ms"] = dist_ms([x for m in mine for x in m.block.ttft_s])
        side["added_gap_ms"] = dist_ms([g - itl_s for m in mine for g in m.block.gaps_s])
        worst = [g - itl_s for m in mine for g in m.block.max_gap_per_stream_s]
        side["worst_added_gap_per_stream_ms"] = dist_ms(worst)
        side["gaps"] = sum(len(m.block.gaps_s) for m in mine)
        if name == "through":
            side["server_timing_ms"] = _stages([m.block for m in mine])
        point[name] = side
    point["added_ttft_ms"] = _added(point, "ttft_ms")
    _gateway_cpu(point, "stream")
    return point
