"""What tiergate adds on top of a backend: the same load sent to a simulator directly and through
the gateway, alternating in short blocks in one run. See docs/bench.md.

    make bench                                          # the full run (~17 min), or:
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
from collections.abc import Callable, Iterator, Sequence
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
from bench import overhead_report, phases  # noqa: E402
from bench.loadgen import Target, new_session, open_block  # noqa: E402
from bench.machine import run_identity  # noqa: E402
from bench.phases import Prompts  # noqa: E402
from bench.points import Gateway, dist_ms, proc_cpu_s, proc_rss_mb  # noqa: E402
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
NOTES = (
    "the report lists each region with its sales for the quarter and notes where the numbers "
    "went up or down compared with last year while the team also wrote about staffing new "
    "stores delays in shipping and a plan to open two more sites before the end of summer"
)
WORDS = tuple(NOTES.split())

# --- prompts ------------------------------------------------------------------------------


def make_prompts(count: int, tokens: int, answer_tokens: int) -> Prompts:
    """``count`` distinct chats of exactly ``tokens`` prompt tokens (the simulator's rule) whose
    natural answer is at least ``answer_tokens`` long, so ``max_tokens`` is what ends it."""
    profile = PROFILES[MODEL]
    lengths = {"min_tokens": profile.min_output_tokens, "max_tokens": profile.max_output_tokens}
    rng = random.Random(7)
    prompts: Prompts = []
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

    def under_test(self, name: str = "through") -> Gateway:
        """The gateway under test (tiergate, or ``--through-url``'s), its target named ``name``."""
        target = self.through()
        target = Target(name, target.url, target.headers, target.model, target.completion_tokens)
        return Gateway(target, self.gateway_pid, self.metrics_url())

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


async def prepare_tiergate(stack: Stack, prompts: Prompts) -> None:
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


# --- the phases -------------------------------------------------------------------------


async def soak(stack: Stack, prompts: Prompts) -> dict[str, Any]:
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
        direct, gateways = stack.direct(), [stack.under_test()]
        if args.concurrency:
            points = await phases.closed_loop(args, direct, gateways, prompts)
            results["closed_loop"] = points["through"]
        if args.rates:
            points = await phases.open_loop(args, direct, gateways, prompts)
            results["open_loop"] = points["through"]
        if args.soak_s > 0:
            if stack.gateway is not None:
                # The soak is the memory target's run (issue 7: 10 minutes at 100 rps): on a
                # fresh gateway. What the phases before left resident (the allocator keeps the
                # peak of in-flight requests) is recorded first, beside it.
                results["environment"]["gateway_rss_mb_after_load_phases"] = proc_rss_mb(
                    stack.gateway_pid
                )
                stack.start_gateway()
                await prepare_tiergate(stack, prompts)
            results["soak"] = await soak(stack, prompts)
            results["soak"]["fresh_gateway"] = stack.gateway is not None
        if args.stream_concurrency:
            stack.start_sim(itl_ms=args.itl_ms)  # on the same port, paced
            await wait_answering(stack.through(), prompts[0])
            points = await phases.streaming(args, direct, gateways, prompts)
            results["streaming"] = points["through"]
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results["errors_total"] = _error_total(results)
    results["clean"] = results["errors_total"] == 0
    results["headline"] = overhead_report.headline(results, p99_budget_ms=args.p99_budget_ms)
    return results


def add_load_args(p: argparse.ArgumentParser) -> None:
    """The options of the load, the stack and the machine (shared with ``bench.compare``)."""
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
        help="length of one block; blocks alternate between the targets",
    )
    p.add_argument("--warmup-s", type=float, default=1.0, help="per target, before each point")
    p.add_argument(
        "--p99-budget-ms",
        type=float,
        default=20.0,
        help="added p99 a sustained rate must stay under",
    )
    p.add_argument(
        "--stream-concurrency",
        type=int,
        nargs="*",
        default=[1, 100],
        help="concurrent streams (none: skip)",
    )
    p.add_argument("--stream-point-s", type=float, default=10.0)
    p.add_argument(
        "--stream-min-streams",
        type=int,
        default=20,
        help="a stream point lasts long enough for this many streams per target (one stream "
        "at a time reads one every --itl-ms x --max-tokens: the time-to-first-token samples)",
    )
    p.add_argument("--stream-block-s", type=float, default=5.0)
    p.add_argument(
        "--itl-ms", type=float, default=50.0, help="the simulator's inter-token latency for streams"
    )
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=50, help="output tokens per answer")
    p.add_argument("--prompts", type=int, default=64, help="distinct prompts, used in turn")
    p.add_argument("--redis-url", help="default: an own redis-server if on PATH")
    p.add_argument("--sim-port", type=int, default=0, help="default: a free port")
    p.add_argument("--cores", type=int, nargs=2, default=[0, 1], metavar=("LOAD", "GATEWAY"))
    p.add_argument("--no-pin", action="store_true", help="do not pin to cores")
    p.add_argument("--plot", type=Path, help="default: --out with .png")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--keep-logs", type=Path, help="copy the gateways' and simulator's logs here")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_load_args(p)
    p.add_argument("--soak-s", type=float, default=600.0, help="memory soak length (0: skip)")
    p.add_argument("--soak-rps", type=float, default=100.0)
    p.add_argument("--through-url", help="another OpenAI-compatible gateway's chat URL")
    p.add_argument("--through-key", default="", help="its API key")
    p.add_argument("--through-model", help="the model to ask it for (tiergate: auto)")
    p.add_argument("--through-pid", type=int, help="its process, for CPU and memory")
    p.add_argument("--through-metrics-url", help="its Prometheus page, if any")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.through_url and not args.sim_port:
        p.error("--through-url needs --sim-port: the port the other gateway sends to")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    import uvloop

    args = parse_args(argv)
    pin = pinning(args)
    results = uvloop.run(run(args, pin))
    publish(args, results, overhead_report.plot, overhead_report.markdown)


def publish(
    args: argparse.Namespace,
    results: dict[str, Any],
    plot: Callable[[dict[str, Any], Path], None],
    markdown: Callable[[dict[str, Any]], str],
) -> None:
    """Write a run's JSON (and plot, unless ``--no-plot``) and print its table."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {args.out} ({results['wall_s']} s)")
    if not args.no_plot:
        image = args.plot or args.out.with_suffix(".png")
        plot(results, image)
        print(f"wrote {image}")
    print()
    print(markdown(results))
    if not results["clean"]:
        print(f"\nTHIS RUN HAD {results['errors_total']} ERRORS (see 'errors' in each point)")


if __name__ == "__main__":
    main()
