"""What tiergate adds on top of a backend: the same load sent to a simulator directly and through
the gateway, alternating in short blocks in one run. See docs/bench.md.

    make bench                                          # the full run (~15 min), or:
    .venv/bin/python -m bench.overhead                  # the same
    .venv/bin/python -m bench.overhead --point-s 4 --soak-s 20 --rates 100 300 --out /tmp/o.json
    .venv/bin/python -m bench.overhead --sim-port 8101 \\
        --through-url http://127.0.0.1:4000/v1/chat/completions --through-key sk-... \\
        --through-model llama-3.1-8b-instruct      # another gateway, pointed at the simulator

Writes ``bench/results/overhead.json`` and ``overhead.png`` and prints the README's table rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import aiohttp
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.sim import PROFILES  # noqa: E402
from backends.sim.answers import answer_pieces  # noqa: E402
from backends.sim.request import parse_chat_request  # noqa: E402
from backends.sim.tokens import prompt_tokens  # noqa: E402
from bench import overhead_report  # noqa: E402
from bench.loadgen import (  # noqa: E402
    Block,
    StreamBlock,
    Target,
    closed_block,
    new_session,
    open_block,
    pct,
    stream_block,
)
from bench.machine import run_identity  # noqa: E402
from tests.support import (  # noqa: E402
    TEST_KEYS,
    Proc,
    RedisServer,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)

RESULTS = ROOT / "bench" / "results" / "overhead.json"
MODEL = "llama-3.1-8b-instruct"
TENANT_KEY = TEST_KEYS["TIERGATE_KEY_ACME"]
ADMIN_KEY = TEST_KEYS["TIERGATE_ADMIN_KEY"]
SLOTS = 256
"""Batch size of the simulator and of the gateway's replica: above every concurrency here, so
neither ever queues for a slot and the comparison is of the request path alone."""
RULE_FILES = ("pii-on-prem.yaml", "code-review.yaml")
"""Applied to the bench tenant: four rules (two regex scans) that do not fire on its prompts."""
METRICS = (
    "tiergate_overhead_seconds",
    "tiergate_route_decision_seconds",
    "tiergate_queue_wait_seconds",
    "tiergate_request_duration_seconds",
    "tiergate_time_to_first_token_seconds",
    "tiergate_inter_token_latency_seconds",
)
NOTES = (
    "the report lists each region with its sales for the quarter and notes where the numbers "
    "went up or down compared with last year while the team also wrote about staffing new "
    "stores delays in shipping and a plan to open two more sites before the end of summer"
)
WORDS = tuple(NOTES.split())

# --- prompts ------------------------------------------------------------------------------


def make_prompts(count: int, tokens: int, answer_tokens: int) -> list[list[dict[str, str]]]:
    """``count`` distinct chats of exactly ``tokens`` prompt tokens (the simulator's rule) whose
    natural answer is at least ``answer_tokens`` long, so ``max_tokens`` is what ends it."""
    profile = PROFILES[MODEL]
    lengths = {"min_tokens": profile.min_output_tokens, "max_tokens": profile.max_output_tokens}
    rng = random.Random(7)
    prompts: list[list[dict[str, str]]] = []
    serial = 0
    while len(prompts) < count:
        serial += 1
        words = [f"Note {serial}: summarize these notes in two plain sentences."]
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": ""},
        ]
        while True:
            messages[1]["content"] = " ".join(words)
            parsed = parse_chat_request({"messages": messages}, supports_continuation=True)
            have = prompt_tokens(parsed.messages)
            if have >= tokens:
                break
            words.append(rng.choice(WORDS) + ("." if have == tokens - 2 else ""))
        if have != tokens:
            continue
        if len(answer_pieces(parsed.messages, None, **lengths)) >= answer_tokens:
            prompts.append(messages)
    return prompts


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


def pinning(args: argparse.Namespace) -> dict[str, Any]:
    """Pin this process (load generator; Redis and the simulator inherit it) to one core and
    say how the gateway is to be started on the other."""
    load_core, gateway_core = args.cores
    if args.no_pin:
        return {"pinned": False, "reason": "--no-pin"}
    if shutil.which("taskset") is None:
        return {"pinned": False, "reason": "taskset not found"}
    available = os.sched_getaffinity(0)
    if not {load_core, gateway_core} <= available or load_core == gateway_core:
        return {"pinned": False, "reason": f"cores {args.cores} not both available"}
    os.sched_setaffinity(0, {load_core})
    return {
        "pinned": True,
        "method": "taskset / sched_setaffinity",
        "load_generator": load_core,
        "redis": load_core,
        "simulator": load_core,
        "gateway": gateway_core,
    }


@dataclass
class Stack:
    """Redis, the simulator and (unless ``--through-url``) the gateway, as real processes."""

    args: argparse.Namespace
    workdir: Path
    pin: dict[str, Any]
    redis: RedisServer | None = None
    redis_url: str = ""
    prefix: str = field(default_factory=lambda: f"tgbench-{uuid.uuid4().hex[:8]}")
    sim: Proc | None = None
    sim_port: int = 0
    gateway: Proc | None = None
    port: int = 0
    admin_port: int = 0
    config: Path | None = None

    def start_redis(self) -> None:
        if self.args.redis_url is None and shutil.which("redis-server"):
            self.redis = RedisServer(self.workdir)
            self.redis.start()
            self.redis_url = self.redis.url
        else:
            self.redis_url = self.args.redis_url or "redis://127.0.0.1:6379/0"

    def start_sim(self, itl_ms: float | None) -> None:
        self.stop_sim()
        self.sim_port = self.sim_port or self.args.sim_port or free_port()
        extra = ["--max-num-seqs", str(SLOTS)]
        if itl_ms is not None:
            extra += ["--itl-ms", str(itl_ms)]
        self.sim, _ = start_sim(
            MODEL, self.sim_port, self.workdir, time_scale=0, extra_args=extra, usage_log=False
        )

    def stop_sim(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None

    def start_gateway(self) -> None:
        self.stop_gateway()
        if self.config is None:
            self.port, self.admin_port = free_port(), free_port()
            self.config = gateway_config(
                workdir=self.workdir,
                redis_url=self.redis_url,
                prefix=self.prefix,
                database_url=f"sqlite+aiosqlite:///{self.workdir / 'ledger.db'}",
                sim_ports={MODEL: self.sim_port},
                port=self.port,
                admin_port=self.admin_port,
            )
            config = yaml.safe_load(self.config.read_text())
            config["deployments"][0]["replicas"][0]["max_num_seqs"] = SLOTS
            self.config.write_text(yaml.safe_dump(config))
        launcher = ["taskset", "-c", str(self.pin["gateway"])] if self.pin["pinned"] else []
        self.gateway = start_gateway(self.config, self.workdir, launcher=launcher)
        wait_ready(self.gateway, f"http://127.0.0.1:{self.port}/readyz")

    def stop_gateway(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None

    @property
    def gateway_pid(self) -> int | None:
        if self.gateway is not None:
            return self.gateway.popen.pid
        pid: int | None = self.args.through_pid
        return pid

    def direct(self) -> Target:
        url = f"http://127.0.0.1:{self.sim_port}/v1/chat/completions"
        headers = {"content-type": "application/json"}
        return Target("direct", url, headers, MODEL, self.args.max_tokens)

    def through(self) -> Target:
        if self.args.through_url:
            url, key, model = self.args.through_url, self.args.through_key, self.args.through_model
        else:
            url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
            key, model = TENANT_KEY, self.args.through_model or "auto"
        headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
        return Target("through", url, headers, model or MODEL, self.args.max_tokens)

    def metrics_url(self) -> str | None:
        if self.args.through_url:
            url: str | None = self.args.through_metrics_url
            return url
        return f"http://127.0.0.1:{self.admin_port}/metrics"

    def close(self) -> None:
        for proc in (self.gateway, self.sim):  # both at once: the gateway drains for a second
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
        self.stop_gateway()
        self.stop_sim()
        if self.args.keep_logs is not None:
            self.args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in self.workdir.glob("*.log"):
                shutil.copy(log, self.args.keep_logs / log.name)
        if self.redis is not None:
            self.redis.stop()
        elif self.redis_url:
            import redis

            client = redis.Redis.from_url(self.redis_url)
            keys = list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
            client.close()


async def prepare_tiergate(stack: Stack, prompts: list[list[dict[str, str]]]) -> None:
    """Apply the bench tenant's rules; check that every prompt is routed to the small tier."""
    base = f"http://127.0.0.1:{stack.port}"
    files = [yaml.safe_load((ROOT / "deploy" / "rules" / f).read_text()) for f in RULE_FILES]
    rules = yaml.safe_dump({"rules": [rule for f in files for rule in f["rules"]]})
    async with aiohttp.ClientSession() as http:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with http.put(f"{base}/v1/rules/acme", data=rules, headers=admin) as resp:
            if resp.status != 200:
                raise RuntimeError(f"rules not applied: {resp.status} {await resp.text()}")
        tenant = {"authorization": f"Bearer {TENANT_KEY}"}
        for messages in prompts:
            body = {"model": "auto", "messages": messages, "max_tokens": stack.args.max_tokens}
            async with http.post(f"{base}/v1/route/explain", json=body, headers=tenant) as resp:
                plan = await resp.json()
            if plan.get("tier") != "small" or (plan.get("deployments") or [None])[0] != MODEL:
                raise RuntimeError(f"a bench prompt is not routed to {MODEL}: {plan}")


async def wait_answering(
    target: Target, messages: list[dict[str, str]], timeout_s: float = 60
) -> None:
    """Until ``target`` streams an answer again (after the simulator behind it restarted)."""
    body = {"model": target.model, "messages": messages, "max_tokens": 2, "stream": True}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.post(target.url, json=body, headers=target.headers) as resp:
                    if resp.status == 200 and (await resp.read()).rstrip().endswith(b"[DONE]"):
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.url} does not answer after the simulator restart")
            await asyncio.sleep(0.2)


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
    gateway_cpu_s: float | None
    load_cpu_pct: float


RunBlock = Callable[[aiohttp.ClientSession, Target, float], Awaitable[Any]]


async def measure_point(
    stack: Stack,
    connections: int,
    run: RunBlock,
    *,
    warmup_s: float,
    point_s: float,
    block_s: float,
) -> tuple[list[Measured], dict[str, Any]]:
    """Warm both targets up, then ``point_s`` of blocks each, alternating (ABBA: direct,
    through, through, direct, ...), reading the gateway's CPU time around every block."""
    blocks = max(1, round(point_s / block_s))
    direct, through = stack.direct(), stack.through()
    pid = stack.gateway_pid
    async with (
        new_session(connections) as to_direct,
        new_session(connections) as to_through,
        aiohttp.ClientSession() as http,
    ):
        sessions = {"direct": to_direct, "through": to_through}
        for target in (direct, through):
            await run(sessions[target.name], target, warmup_s)
        before = await scrape(http, stack.metrics_url())
        measured: list[Measured] = []
        for i in range(blocks):
            for target in (direct, through) if i % 2 == 0 else (through, direct):
                cpu0, load0, wall0 = proc_cpu_s(pid), time.process_time(), time.perf_counter()
                block = await run(sessions[target.name], target, block_s)
                cpu1, load1, wall1 = proc_cpu_s(pid), time.process_time(), time.perf_counter()
                gateway_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
                load_pct = 100 * (load1 - load0) / (wall1 - wall0)
                measured.append(Measured(block, gateway_cpu, load_pct))
        after = await scrape(http, stack.metrics_url())
    return measured, histogram_delta(before, after)


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


def _stages(blocks: Sequence[Block]) -> dict[str, dict[str, float | None]] | None:
    merged: dict[str, list[float]] = {}
    for block in blocks:
        for name, values in block.stages_ms.items():
            merged.setdefault(name, []).extend(values)
    if not merged:
        return None
    return {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for name, v in merged.items()}


def _side(measured: Sequence[Measured]) -> dict[str, Any]:
    """What one target's blocks of a point add up to (shared by JSON and streamed blocks)."""
    ok = sum(m.block.ok for m in measured)
    wall = sum(m.block.wall_s for m in measured)
    cpus = [m.gateway_cpu_s for m in measured]
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


def json_point(measured: list[Measured]) -> dict[str, Any]:
    point: dict[str, Any] = {}
    for name in ("direct", "through"):
        mine = [m for m in measured if m.block.target == name]
        side = _side(mine)
        side["latency_ms"] = dist_ms([x for m in mine for x in m.block.latencies_s])
        if name == "through":
            side["server_timing_ms"] = _stages([m.block for m in mine])
            own = [x / 1000 for m in mine for x in m.block.overhead_header_ms]
            side["x_tiergate_overhead_ms"] = dist_ms(own) if own else None
        side["blocks"] = [
            {"ok": m.block.ok, "p50_ms": ms(pct(m.block.latencies_s, 0.5)),
             "p99_ms": ms(pct(m.block.latencies_s, 0.99)), "gateway_cpu_s": m.gateway_cpu_s}
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


def stream_point(measured: list[Measured], itl_s: float) -> dict[str, Any]:
    point: dict[str, Any] = {}
    for name in ("direct", "through"):
        mine = [m for m in measured if m.block.target == name]
        side = _side(mine)
        side["ttft_ms"] = dist_ms([x for m in mine for x in m.block.ttft_s])
        side["added_gap_ms"] = dist_ms([g - itl_s for m in mine for g in m.block.gaps_s])
        worst = [g - itl_s for m in mine for g in m.block.max_gap_per_stream_s]
        side["worst_added_gap_per_stream_ms"] = dist_ms(worst)
        side["gaps"] = sum(len(m.block.gaps_s) for m in mine)
        point[name] = side
    point["added_ttft_ms"] = _added(point, "ttft_ms")
    _gateway_cpu(point, "stream")
    return point


def _print_json_point(label: str, point: dict[str, Any]) -> None:
    added, d, t = point["added_latency_ms"], point["direct"], point["through"]
    errors = {**{f"direct {k}": v for k, v in d["errors"].items()}, **t["errors"]}
    print(
        f"{label:>10}  direct p50 {d['latency_ms']['p50']} p99 {d['latency_ms']['p99']} ms | "
        f"through p50 {t['latency_ms']['p50']} p99 {t['latency_ms']['p99']} ms | "
        f"added p50 {added['p50']} p99 {added['p99']} ms | "
        f"cpu {point.get('gateway_cpu_ms_per_request')} ms/req | "
        f"{t['throughput_rps']} rps" + (f" | ERRORS {errors}" if errors else ""),
        flush=True,
    )


async def closed_loop(stack: Stack, prompts: list[list[dict[str, str]]]) -> list[dict[str, Any]]:
    args, points = stack.args, []
    for c in args.concurrency:

        async def run(s: aiohttp.ClientSession, t: Target, d: float, c: int = c) -> Block:
            return await closed_block(s, t, prompts, concurrency=c, duration_s=d)

        measured, metrics = await measure_point(
            stack, c, run, warmup_s=args.warmup_s, point_s=args.point_s, block_s=args.block_s
        )
        point = {"concurrency": c, **json_point(measured), "metrics": metrics}
        _print_json_point(f"c={c}", point)
        points.append(point)
    return points


def _fell_over(point: dict[str, Any], rate: float) -> bool:
    through = point["through"]
    failed = sum(through["errors"].values())
    p99 = through["latency_ms"]["p99"]
    return (
        failed > 0.01 * max(through["sent"], 1)
        or (through["achieved_rps"] or 0) < 0.9 * rate
        or p99 is None
        or p99 > 1000
    )


async def open_loop(stack: Stack, prompts: list[list[dict[str, str]]]) -> list[dict[str, Any]]:
    """Rising fixed rates; stops after the first rate the gateway cannot serve."""
    args, points = stack.args, []
    for rate in args.rates:

        async def run(s: aiohttp.ClientSession, t: Target, d: float, r: float = rate) -> Block:
            return await open_block(s, t, prompts, rate=r, duration_s=d)

        measured, metrics = await measure_point(
            stack, 0, run, warmup_s=min(args.warmup_s, 1.0), point_s=args.point_s,
            block_s=args.block_s,
        )  # fmt: skip
        point = {"rate_rps": rate, **json_point(measured), "metrics": metrics}
        for side in (point["direct"], point["through"]):
            side["achieved_rps"] = side["throughput_rps"]  # ok / (first start .. last answer)
        added_p99 = point["added_latency_ms"]["p99"]
        point["sustained"] = (
            not point["through"]["errors"]
            and not point["direct"]["errors"]
            and point["through"]["achieved_rps"] >= 0.95 * rate
            and added_p99 is not None
            and added_p99 < args.p99_budget_ms
        )
        point["fell_over"] = _fell_over(point, rate)
        _print_json_point(f"{rate:g} rps", point)
        points.append(point)
        if point["fell_over"]:
            print(f"    the gateway fell over at {rate:g} rps: stopping the rate ramp", flush=True)
            break
    return points


async def soak(stack: Stack, prompts: list[list[dict[str, str]]]) -> dict[str, Any]:
    """``--soak-rps`` through the gateway for ``--soak-s``; resident memory every 10 s."""
    args, through, pid = stack.args, stack.through(), stack.gateway_pid
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    async with new_session(0) as session:
        warmup_s = min(2.0, args.soak_s)
        await open_block(session, through, prompts, rate=args.soak_rps, duration_s=warmup_s)
        rss_before = proc_rss_mb(pid)
        series: list[tuple[float, float | None]] = [(0.0, rss_before)]
        started, cpu0 = time.perf_counter(), proc_cpu_s(pid)
        while (elapsed := time.perf_counter() - started) < args.soak_s - 0.05:
            duration = min(10.0, args.soak_s - elapsed)
            block = await open_block(
                session, through, prompts, rate=args.soak_rps, duration_s=duration
            )
            sent += block.sent
            latencies += block.latencies_s
            for kind, n in block.errors.items():
                errors[kind] = errors.get(kind, 0) + n
            series.append((round(time.perf_counter() - started, 1), proc_rss_mb(pid)))
        wall, cpu1 = time.perf_counter() - started, proc_cpu_s(pid)
    rss_after = series[-1][1]
    growth = None
    if rss_before and rss_after:
        growth = round(100 * (rss_after - rss_before) / rss_before, 2)
    result = {
        "duration_s": round(wall, 1),
        "rate_rps": args.soak_rps,
        "sent": sent,
        "ok": len(latencies),
        "errors": errors,
        "latency_ms": dist_ms(latencies),
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
        "rss_growth_pct": growth,
        "rss_mb_series": series,
        "gateway_cpu_ms_per_request": None
        if cpu0 is None or cpu1 is None or not latencies
        else round(1000 * (cpu1 - cpu0) / len(latencies), 3),
    }
    print(
        f"      soak  {result['ok']} ok, errors {errors or 0}, RSS {rss_before} -> {rss_after} MB "
        f"({growth} %)",
        flush=True,
    )
    return result


async def streaming(stack: Stack, prompts: list[list[dict[str, str]]]) -> list[dict[str, Any]]:
    args, points = stack.args, []
    for c in args.stream_concurrency:

        async def run(s: aiohttp.ClientSession, t: Target, d: float, c: int = c) -> StreamBlock:
            spread = min(args.itl_ms / 1000 * args.max_tokens, d / 2)  # one stream's length
            return await stream_block(s, t, prompts, concurrency=c, duration_s=d, spread_s=spread)

        measured, metrics = await measure_point(
            stack, c, run, warmup_s=0.01, point_s=args.stream_point_s,
            block_s=args.stream_block_s,
        )  # fmt: skip
        point = {"concurrency": c, **stream_point(measured, args.itl_ms / 1000), "metrics": metrics}
        d, t = point["direct"], point["through"]
        errors = {**{f"direct {k}": v for k, v in d["errors"].items()}, **t["errors"]}
        print(
            f"stream c={c}  ttft direct p50 {d['ttft_ms']['p50']} through p50 "
            f"{t['ttft_ms']['p50']} ms | added ttft p50 {point['added_ttft_ms']['p50']} p99 "
            f"{point['added_ttft_ms']['p99']} ms | added gap through p99 "
            f"{t['added_gap_ms']['p99']} max {t['added_gap_ms']['max']} ms (direct p99 "
            f"{d['added_gap_ms']['p99']} max {d['added_gap_ms']['max']})"
            + (f" | ERRORS {errors}" if errors else ""),
            flush=True,
        )
        points.append(point)
    return points


# --- the run ------------------------------------------------------------------------------


def environment(args: argparse.Namespace, pin: dict[str, Any]) -> dict[str, Any]:
    return {
        **run_identity(),
        "pinning": pin,
        "through": args.through_url or "tiergate serve (started by the bench)",
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in {"through_key", "out", "plot", "keep_logs"}
        },
    }


def _error_total(results: dict[str, Any]) -> int:
    total = 0
    for section in ("closed_loop", "open_loop", "streaming"):
        for point in results.get(section) or []:
            total += sum(point["direct"]["errors"].values())
            total += sum(point["through"]["errors"].values())
    if results.get("soak"):
        total += sum(results["soak"]["errors"].values())
    return total


@contextlib.contextmanager
def running_stack(args: argparse.Namespace, pin: dict[str, Any]) -> Iterator[Stack]:
    with TemporaryDirectory(prefix="tiergate-bench-") as tmp:
        stack = Stack(args, Path(tmp), pin)
        try:
            stack.start_redis()
            yield stack
        finally:
            stack.close()


async def run(args: argparse.Namespace, pin: dict[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {"environment": environment(args, pin)}
    started = time.perf_counter()
    prompts = make_prompts(args.prompts, args.prompt_tokens, args.max_tokens)
    results["load"] = {
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "distinct_prompts": len(prompts),
        "model": args.through_model or "auto",
        "stream_itl_ms": args.itl_ms,
    }
    with running_stack(args, pin) as stack:
        if args.through_url:
            stack.start_sim(itl_ms=None)
        else:
            # Both take seconds to import; the gateway does not need the simulator to start.
            stack.sim_port = args.sim_port or free_port()
            with ThreadPoolExecutor(1) as pool:
                sim_started = pool.submit(stack.start_sim, None)
                stack.start_gateway()
                sim_started.result()
            await prepare_tiergate(stack, prompts)
            results["environment"]["gateway_rss_mb_at_ready"] = proc_rss_mb(stack.gateway_pid)
        print(f"direct: {stack.direct().url}\nthrough: {stack.through().url}", flush=True)
        if args.concurrency:
            results["closed_loop"] = await closed_loop(stack, prompts)
        if args.rates:
            results["open_loop"] = await open_loop(stack, prompts)
        if args.soak_s > 0:
            results["soak"] = await soak(stack, prompts)
        if args.stream_concurrency:
            stack.start_sim(itl_ms=args.itl_ms)  # on the same port, paced
            await wait_answering(stack.through(), prompts[0])
            results["streaming"] = await streaming(stack, prompts)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results["errors_total"] = _error_total(results)
    results["clean"] = results["errors_total"] == 0
    results["headline"] = overhead_report.headline(results, p99_budget_ms=args.p99_budget_ms)
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="*",
        default=[1, 16, 64],
        help="closed-loop concurrencies (none: skip)",
    )
    p.add_argument(
        "--rates",
        type=float,
        nargs="*",
        default=[100, 200, 300, 400, 500],
        help="open-loop rates, requests/s, rising (none: skip)",
    )
    p.add_argument(
        "--point-s", type=float, default=10.0, help="seconds of load per target per point"
    )
    p.add_argument(
        "--block-s",
        type=float,
        default=2.0,
        help="length of one block; blocks alternate direct / through",
    )
    p.add_argument("--warmup-s", type=float, default=1.0, help="per target, before each point")
    p.add_argument(
        "--p99-budget-ms",
        type=float,
        default=20.0,
        help="added p99 a sustained rate must stay under",
    )
    p.add_argument("--soak-s", type=float, default=600.0, help="memory soak length (0: skip)")
    p.add_argument("--soak-rps", type=float, default=100.0)
    p.add_argument(
        "--stream-concurrency",
        type=int,
        nargs="*",
        default=[1, 100],
        help="concurrent streams (none: skip)",
    )
    p.add_argument("--stream-point-s", type=float, default=10.0)
    p.add_argument("--stream-block-s", type=float, default=5.0)
    p.add_argument(
        "--itl-ms", type=float, default=50.0, help="the simulator's inter-token latency for streams"
    )
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=50, help="output tokens per answer")
    p.add_argument("--prompts", type=int, default=64, help="distinct prompts, used in turn")
    p.add_argument("--redis-url", help="default: an own redis-server if on PATH")
    p.add_argument("--sim-port", type=int, default=0, help="default: a free port")
    p.add_argument("--through-url", help="another OpenAI-compatible gateway's chat URL")
    p.add_argument("--through-key", default="", help="its API key")
    p.add_argument("--through-model", help="the model to ask it for (tiergate: auto)")
    p.add_argument("--through-pid", type=int, help="its process, for CPU and memory")
    p.add_argument("--through-metrics-url", help="its Prometheus page, if any")
    p.add_argument("--cores", type=int, nargs=2, default=[0, 1], metavar=("LOAD", "GATEWAY"))
    p.add_argument("--no-pin", action="store_true", help="do not pin to cores")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--plot", type=Path, help="default: --out with .png")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--keep-logs", type=Path, help="copy the gateway's and simulator's logs here")
    args = p.parse_args(argv)
    if args.through_url and not args.sim_port:
        p.error("--through-url needs --sim-port: the port the other gateway sends to")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    import uvloop

    args = parse_args(argv)
    pin = pinning(args)
    results = uvloop.run(run(args, pin))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {args.out} ({results['wall_s']} s)")
    if not args.no_plot:
        plot = args.plot or args.out.with_suffix(".png")
        overhead_report.plot(results, plot)
        print(f"wrote {plot}")
    print()
    print(overhead_report.markdown(results))
    if not results["clean"]:
        print(f"\nTHIS RUN HAD {results['errors_total']} ERRORS (see 'errors' in each point)")


if __name__ == "__main__":
    main()
