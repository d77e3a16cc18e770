"""tiergate against LiteLLM's proxy on the same load, machine and backend, in one run: the overhead
bench's load (``bench.overhead``) sent to a simulator directly, through tiergate and through
LiteLLM's proxy, in alternating blocks, both gateways pinned to the same core (one serving at a
time, the other idle). Each gateway's figures as ``overhead.json`` has them, and their ratios.
See docs/bench.md ("tiergate against LiteLLM's proxy").

    make bench-compare                      # ~9 min (the first time ~3 more: bench/.venv-litellm)
    .venv/bin/python -m bench.compare       # the same, once that virtualenv exists
    .venv/bin/python -m bench.compare --point-s 3 --stream-point-s 5 \\
        --out "$(mktemp -d)/compare.json" --label "a look"      # ~3 min

LiteLLM's proxy comes from its own virtualenv (``bench/litellm-proxy.txt``, hash-pinned), never
the project's. Writes ``bench/results/compare.json`` and ``compare.png`` and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import compare_report, overhead_report, phases  # noqa: E402
from bench.loadgen import Target  # noqa: E402
from bench.machine import run_identity  # noqa: E402
from bench.overhead import (  # noqa: E402
    MODEL,
    Stack,
    add_load_args,
    make_prompts,
    pinning,
    prepare_tiergate,
    publish,
    running_stack,
    wait_answering,
)
from bench.phases import Prompts  # noqa: E402
from bench.points import Gateway, proc_rss_mb  # noqa: E402
from tests.support import Proc, free_port, wait_ready  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "compare.json"
LITELLM_VENV = ROOT / "bench" / ".venv-litellm"
LITELLM_PIN = "1.82.6"
"""The version ``bench/litellm-proxy.txt`` pins (the project's reviewed one)."""
LITELLM_KEY = "sk-bench-compare"
KEEP_ALIVE_S = 75
"""Idle keep-alive for LiteLLM's uvicorn, as tiergate's default ``server.keep_alive_s``: neither
gateway closes the load generator's connections between its blocks."""
LITELLM_ENV = {
    "LITELLM_MASTER_KEY": LITELLM_KEY,
    "LITELLM_LOG": "ERROR",  # its own loggers: errors only, as its production advice has it
    "LITELLM_MODE": "PRODUCTION",  # no .env file read at start
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the price list it ships, not one fetched at start
    "HF_HUB_OFFLINE": "1",  # no Hugging Face Hub look-ups (there is no network on the bench)
}
"""The proxy's environment, on top of the bench's."""
SECTIONS = ("closed_loop", "open_loop", "streaming")

# --- LiteLLM's proxy -----------------------------------------------------------------------


def litellm_config(sim_port: int) -> dict[str, Any]:
    """One deployment, the simulator, under the model name the bench asks for; a master key
    (from the environment), no database (so no spend or error logs written), no telemetry, no
    tokenizer downloads (token counts fall back to the tiktoken encoding it ships)."""
    return {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"hosted_vllm/{MODEL}",
                    "api_base": f"http://127.0.0.1:{sim_port}/v1",
                },
            }
        ],
        "litellm_settings": {
            "telemetry": False,
            "disable_hf_tokenizer_download": True,
            "request_timeout": 60,
        },
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "disable_spend_logs": True,
            "disable_error_logs": True,
        },
    }


@dataclass
class LiteLLMProxy:
    """``litellm --config ...`` with one uvicorn worker (one process), pinned like tiergate."""

    binary: Path
    workdir: Path
    launcher: Sequence[str]
    completion_tokens: int = 0
    """Every answer's length (the bench's ``--max-tokens``)."""
    proc: Proc | None = None
    port: int = 0

    def command(self, config: Path) -> list[str]:
        return [
            *self.launcher, str(self.binary), "--config", str(config), "--host", "127.0.0.1",
            "--port", str(self.port), "--num_workers", "1", "--telemetry", "False",
            "--keepalive_timeout", str(KEEP_ALIVE_S),
        ]  # fmt: skip

    def start(self, sim_port: int) -> None:
        config = self.workdir / "litellm.yaml"
        config.write_text(yaml.safe_dump(litellm_config(sim_port), sort_keys=False))
        self.port = free_port()
        self.proc = Proc(self.command(config), self.workdir / "litellm.log", LITELLM_ENV)
        wait_ready(self.proc, f"http://127.0.0.1:{self.port}/health/liveliness", timeout_s=180)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def gateway(self) -> Gateway:
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        headers = {"content-type": "application/json", "authorization": f"Bearer {LITELLM_KEY}"}
        pid = self.proc.popen.pid if self.proc is not None else None
        return Gateway(Target("litellm", url, headers, MODEL, self.completion_tokens), pid)


def litellm_binary(args: argparse.Namespace) -> Path:
    binary: Path = args.litellm or LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        raise SystemExit(
            f"{binary} not found: `make bench-compare` creates LiteLLM's virtualenv (docs/bench.md)"
        )
    return binary


def litellm_version(binary: Path) -> str:
    """The version installed beside ``binary`` (its virtualenv's Python)."""
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    done = subprocess.run(
        [str(binary.parent / "python"), "-c", code], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


# --- the run ------------------------------------------------------------------------------


def environment(args: argparse.Namespace, pin: dict[str, Any], litellm: str) -> dict[str, Any]:
    return {
        **run_identity(),
        "pinning": pin,
        "gateways": {
            "tiergate": "tiergate serve (started by the bench, as in overhead.json)",
            "litellm": {
                "version": litellm,
                "command": "litellm --config litellm.yaml --host 127.0.0.1 --port <free> "
                f"--num_workers 1 --telemetry False --keepalive_timeout {KEEP_ALIVE_S}",
                "config": litellm_config(0),
                "environment": {k: v for k, v in LITELLM_ENV.items() if "KEY" not in k},
            },
        },
        "settings": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in {"out", "plot", "keep_logs", "litellm"} and not k.startswith("through")
        },
    }


def error_total(results: dict[str, Any]) -> int:
    """Every gateway's errors, and the direct target's once per point."""
    total, seen = 0, set()
    for gateway in results["gateways"].values():
        for section in SECTIONS:
            for point in gateway.get(section) or []:
                total += sum(point["through"]["errors"].values())
                key = (section, point.get("concurrency"), point.get("rate_rps"))
                if key not in seen:
                    seen.add(key)
                    total += sum(point["direct"]["errors"].values())
    return total


@contextlib.contextmanager
def running_proxy(stack: Stack, binary: Path) -> Iterator[LiteLLMProxy]:
    launcher = ["taskset", "-c", str(stack.pin["gateway"])] if stack.pin["pinned"] else []
    proxy = LiteLLMProxy(binary, stack.workdir, launcher, stack.args.max_tokens)
    try:
        yield proxy
    finally:
        proxy.stop()


def _rss(
    gateways: Sequence[Gateway], memory: dict[str, dict[str, float | None]], when: str
) -> None:
    for g in gateways:
        memory[g.name][when] = proc_rss_mb(g.pid)


async def measure(
    args: argparse.Namespace, stack: Stack, proxy: LiteLLMProxy, prompts: Prompts
) -> dict[str, dict[str, Any]]:
    """The three targets through every phase; each gateway's points and resident memory."""
    direct = stack.direct()
    gateways = [stack.under_test("tiergate"), proxy.gateway()]
    print(f"direct: {direct.url}", flush=True)
    for g in gateways:
        print(f"{g.name}: {g.target.url} (pid {g.pid})", flush=True)
    out: dict[str, dict[str, Any]] = {g.name: {} for g in gateways}
    memory: dict[str, dict[str, float | None]] = {g.name: {} for g in gateways}
    _rss(gateways, memory, "at_ready")
    runs = (
        ("closed_loop", args.concurrency, phases.closed_loop),
        ("open_loop", args.rates, phases.open_loop),
        ("streaming", args.stream_concurrency, phases.streaming),
    )
    for section, steps, phase in runs:
        if not steps:
            continue
        if section == "streaming":
            stack.start_sim(itl_ms=args.itl_ms)  # on the same port, paced
            for g in gateways:
                await wait_answering(g.target, prompts[0])
        for name, points in (await phase(args, direct, gateways, prompts)).items():
            out[name][section] = points
        _rss(gateways, memory, f"after_{section}")
    for g in gateways:
        seen = [v for v in memory[g.name].values() if v is not None]
        out[g.name]["rss_mb"] = {**memory[g.name], "max": max(seen, default=None)}
    return out


async def run(args: argparse.Namespace, pin: dict[str, Any]) -> dict[str, Any]:
    binary = litellm_binary(args)
    started = time.perf_counter()
    version = litellm_version(binary)
    if version != LITELLM_PIN:
        print(f"WARNING: LiteLLM {version}, not the pinned {LITELLM_PIN}", flush=True)
    results: dict[str, Any] = {"environment": environment(args, pin, version)}
    prompts = make_prompts(args.prompts, args.prompt_tokens, args.max_tokens)
    results["load"] = {
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "distinct_prompts": len(prompts),
        "model": {"tiergate": "auto", "litellm": MODEL},
        "stream_itl_ms": args.itl_ms,
    }
    with running_stack(args, pin) as stack, running_proxy(stack, binary) as proxy:
        # Each takes seconds to import; neither gateway needs the simulator to start.
        stack.sim_port = args.sim_port or free_port()
        with ThreadPoolExecutor(2) as pool:
            sim_started = pool.submit(stack.start_sim, None)
            proxy_started = pool.submit(proxy.start, stack.sim_port)
            stack.start_gateway()
            sim_started.result()
            proxy_started.result()
        await prepare_tiergate(stack, prompts)
        await wait_answering(proxy.gateway().target, prompts[0])
        results["gateways"] = await measure(args, stack, proxy, prompts)
    for view in results["gateways"].values():  # each as overhead.json's headline has it
        view["headline"] = overhead_report.headline(view, p99_budget_ms=args.p99_budget_ms)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results["errors_total"] = error_total(results)
    results["clean"] = results["errors_total"] == 0
    results["comparison"] = compare_report.comparison(results, p99_budget_ms=args.p99_budget_ms)
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_load_args(p)
    p.add_argument(
        "--litellm", type=Path, help="the proxy's `litellm` (default: bench/.venv-litellm's)"
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--label", help="stored in the JSON, e.g. 'dev run, noisy machine'")
    # What bench.overhead's Stack reads: here tiergate is always the bench's own.
    p.set_defaults(
        through_url=None, through_key="", through_model=None, through_pid=None,
        through_metrics_url=None,
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    import uvloop

    args = parse_args(argv)
    pin = pinning(args)
    results = uvloop.run(run(args, pin))
    if args.label:
        results = {"label": args.label, **results}
    publish(args, results, compare_report.plot, compare_report.markdown)


if __name__ == "__main__":
    main()
