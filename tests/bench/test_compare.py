"""The comparison bench (tiergate against LiteLLM's proxy): its ratios, table rows, block order
and proxy config; and, where LiteLLM's virtualenv exists (`make bench-compare` creates it), a
tiny run end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.compare import litellm_config
from bench.compare_report import comparison, figures, markdown, ratio
from bench.loadgen import Target
from bench.points import block_order

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (2.0, 4.0, 0.5),
        (9.0, 3.0, 3.0),
        (1.0, 3.0, 0.33),
        (0.0, 3.0, None),  # a difference of percentiles at zero or below: noise, no ratio
        (-0.4, 3.0, None),
        (3.0, -0.4, None),
        (None, 3.0, None),
        (3.0, None, None),
    ],
)
def test_ratio_only_of_positive_figures(a: float | None, b: float | None, expected: Any) -> None:
    assert ratio(a, b) == expected


def test_blocks_alternate_forwards_and_back() -> None:
    a, b, c = (Target(name, "", {}, "", 0) for name in ("direct", "tiergate", "litellm"))
    assert block_order([a, b], 3) == [a, b, b, a, a, b]  # the overhead bench's ABBA
    assert block_order([a, b, c], 2) == [a, b, c, c, b, a]


def test_litellm_config_points_at_the_simulator_without_database_or_telemetry() -> None:
    config = litellm_config(8101)
    (deployment,) = config["model_list"]
    assert deployment["model_name"] == "llama-3.1-8b-instruct"
    assert deployment["litellm_params"] == {
        "model": "hosted_vllm/llama-3.1-8b-instruct",
        "api_base": "http://127.0.0.1:8101/v1",
    }
    general = config["general_settings"]
    assert general["master_key"] == "os.environ/LITELLM_MASTER_KEY"  # never the key itself
    assert "database_url" not in general and general["disable_spend_logs"] is True
    assert config["litellm_settings"]["telemetry"] is False


def _closed(c: int, added: list[float], cpu: float) -> dict[str, Any]:
    return {
        "concurrency": c,
        "added_latency_ms": dict(zip(("p50", "p90", "p99"), added, strict=True)),
        "gateway_cpu_ms_per_request": cpu,
    }


def _rate(rate: float, added_p99: float, sustained: bool, fell_over: bool) -> dict[str, Any]:
    through = {"achieved_rps": rate, "errors": {}, "gateway_cpu_pct": 50.0}
    return {
        "rate_rps": rate,
        "added_latency_ms": {"p50": 1.0, "p90": 2.0, "p99": added_p99},
        "through": through,
        "sustained": sustained,
        "fell_over": fell_over,
    }


def _stream(c: int, ttft: list[float], gap: list[float]) -> dict[str, Any]:
    return {
        "concurrency": c,
        "added_ttft_ms": {"p50": ttft[0], "p90": ttft[1], "p99": ttft[1]},
        "through": {"added_gap_ms": {"p99": gap[0], "max": gap[1]}},
        "gateway_cpu_ms_per_stream": 10.0,
    }


def _results() -> dict[str, Any]:
    tiergate = {
        "closed_loop": [_closed(1, [2.0, 3.0, 5.0], 2.5)],
        "open_loop": [_rate(100, 7, True, False), _rate(200, 9, True, False)],
        "streaming": [_stream(1, [4.0, 6.0], [1.0, 2.0])],
        "rss_mb": {"at_ready": 180.0, "max": 190.0},
    }
    litellm = {
        "closed_loop": [_closed(1, [8.0, 12.0, -1.0], 10.0)],
        "open_loop": [_rate(100, 30, False, False), _rate(200, 900, False, True)],
        "streaming": [_stream(1, [8.0, 12.0], [2.0, 8.0])],
        "rss_mb": {"at_ready": 300.0, "max": 380.0},
    }
    return {
        "gateways": {"tiergate": tiergate, "litellm": litellm},
        "environment": {
            "commit": "0123456789abcdef", "dirty": False, "date": "2026-12-02T08:00:00+00:00",
            "cpus": 2, "cpu": "a CPU", "pinning": {"pinned": False, "reason": "--no-pin"},
            "gateways": {"litellm": {"version": "1.82.6"}},
        },
        "wall_s": 12.0, "clean": True, "errors_total": 0,
    }  # fmt: skip


def test_figures_and_ratios_of_one_run() -> None:
    results = _results()
    tiergate = figures(results["gateways"]["tiergate"])
    assert tiergate["c1_added_latency_ms_p50"] == 2.0 and tiergate["c1_cpu_ms_per_request"] == 2.5
    assert tiergate["max_sustained_rps"] == 200 and tiergate["fell_over_at_rps"] is None
    assert tiergate["streams1_added_gap_ms_max"] == 2.0 and tiergate["rss_mb_max"] == 190.0

    comp = comparison(results)
    litellm = comp["figures"]["litellm"]
    assert litellm["max_sustained_rps"] is None and litellm["fell_over_at_rps"] == 200
    ratios = comp["ratio_tiergate_to_litellm"]
    assert ratios["c1_added_latency_ms_p50"] == 0.25
    assert ratios["c1_added_latency_ms_p99"] is None  # LiteLLM's -1 ms is noise
    assert ratios["c1_cpu_ms_per_request"] == 0.25
    assert ratios["max_sustained_rps"] is None
    assert ratios["rss_mb_at_ready"] == 0.6


def test_table_rows() -> None:
    results = _results()
    results["comparison"] = comparison(results)
    table = markdown(results)
    assert "| figure | tiergate | LiteLLM proxy | tiergate / LiteLLM |" in table
    assert (
        "| added latency, concurrency 1 (p50 / p90 / p99) | 2.00 / 3.00 / 5.00 ms "
        "| 8.00 / 12.00 / -1.00 ms | 0.25 / 0.25 / — |"
    ) in table
    assert (
        "| highest rate on one gateway core, added p99 < 20 ms | 200 rps "
        "| none of the rates tried | — |"
    ) in table
    assert "(p99 / max), 1 stream | 1.00 / 2.00 ms | 2.00 / 8.00 ms | 0.50 / 0.25 |" in table
    assert "(p50 / p99), 1 stream | 4.00 / 6.00 ms | 8.00 / 12.00 ms | 0.50 / 0.50 |" in table
    assert "LiteLLM 1.82.6" in table and "no errors" in table
