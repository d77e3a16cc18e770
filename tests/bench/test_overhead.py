"""The overhead bench end to end at a tiny scale: a real simulator, Redis and `tiergate serve`,
every section run once, the JSON, the plot and the README rows sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends.sim.request import parse_chat_request
from backends.sim.tokens import prompt_tokens
from bench.loadgen import pct, server_timing
from bench.overhead import make_prompts

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--concurrency", "1", "--rates", "50", "--point-s", "1", "--block-s", "0.5",
    "--warmup-s", "0.1", "--soak-s", "1", "--soak-rps", "20",
    "--stream-concurrency", "2", "--itl-ms", "10", "--stream-point-s", "0.4",
    "--stream-block-s", "0.2", "--stream-min-streams", "2", "--prompts", "4",
]  # fmt: skip


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and value > 0


def test_tiny_run_writes_sane_results(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", *TINY, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert (tmp_path / "overhead.png").stat().st_size > 10_000

    env = results["environment"]
    assert len(env["commit"]) == 40 and env["python"].startswith("3.11")
    assert env["cpu"] and "pinned" in env["pinning"]
    assert results["clean"] and results["errors_total"] == 0, done.stdout

    (c1,) = results["closed_loop"]
    assert c1["concurrency"] == 1
    for side in ("direct", "through"):
        assert c1[side]["ok"] > 10 and c1[side]["errors"] == {}
        assert all(_positive(c1[side]["latency_ms"][q]) for q in ("p50", "p90", "p99"))
    assert c1["through"]["latency_ms"]["p50"] > c1["direct"]["latency_ms"]["p50"]
    assert set(c1["added_latency_ms"]) == {"p50", "p90", "p99"}
    assert _positive(c1["gateway_cpu_ms_per_request"])
    assert c1["metrics"]["tiergate_overhead_seconds"]["count"] >= c1["through"]["ok"]
    assert "server_timing_ms" in c1["through"]  # None until the gateway sends the header

    (rate,) = results["open_loop"]
    assert rate["rate_rps"] == 50 and _positive(rate["through"]["achieved_rps"])
    assert isinstance(rate["sustained"], bool) and isinstance(rate["fell_over"], bool)

    soak = results["soak"]
    assert soak["ok"] > 0 and _positive(soak["rss_mb_before"]) and _positive(soak["rss_mb_after"])
    assert soak["fresh_gateway"] is True  # the memory target's run starts from a new process
    assert _positive(results["environment"]["gateway_rss_mb_after_load_phases"])

    (stream,) = results["streaming"]
    for side in ("direct", "through"):
        assert stream[side]["ok"] >= 2 and stream[side]["errors"] == {}
        assert _positive(stream[side]["ttft_ms"]["p50"])
        assert stream[side]["gaps"] == stream[side]["ok"] * 49  # 50 chunks per stream
    assert stream["through"]["added_gap_ms"]["max"] is not None
    stages = stream["through"]["server_timing_ms"]  # tiergate's time to the first chunk
    assert _positive(stages["backend"]["p50"]) and _positive(stages["total"]["p50"])

    head = results["headline"]
    assert head["added_latency_ms_c1"] == c1["added_latency_ms"]
    assert "| added latency, concurrency 1" in done.stdout
    assert "no errors" in done.stdout


def test_prompts_have_the_asked_size_and_a_long_enough_answer() -> None:
    prompts = make_prompts(8, 200, 50)
    assert len({p[1]["content"] for p in prompts}) == 8
    for messages in prompts:
        parsed = parse_chat_request({"messages": messages}, supports_continuation=True)
        assert prompt_tokens(parsed.messages) == 200


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (
            "parse;dur=0.05, auth;dur=0.02, total;dur=1.5",
            {"parse": 0.05, "auth": 0.02, "total": 1.5},
        ),
        ('queue;desc="wait";dur=3', {"queue": 3.0}),
        ("cache, route;dur=x, relay;dur=0.1", {"relay": 0.1}),
        ("", {}),
    ],
)
def test_server_timing_header_is_parsed(header: str, parsed: dict[str, float]) -> None:
    assert server_timing(header) == parsed


def test_nearest_rank_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert pct(values, 0.5) == 50 and pct(values, 0.99) == 99 and pct(values, 1.0) == 100
    assert pct([], 0.5) is None and pct([3.0], 0.99) == 3.0
