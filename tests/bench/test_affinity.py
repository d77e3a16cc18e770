"""The affinity bench end to end at a tiny scale (real simulators, Redis and `tiergate serve`,
both runs), and its placement arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.affinity import Turn, placement, user_message

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--conversations", "4", "--turns", "3", "--replicas", "2", "--warmup", "4",
    "--think-s", "0", "--stagger-s", "0.2", "--max-tokens", "8", "--time-scale", "0.2",
    "--system-words", "40", "--user-words", "10-20",
]  # fmt: skip


@pytest.mark.timeout(150)
def test_tiny_run_keeps_turns_home_with_affinity_and_sends_the_same_load(tmp_path: Path) -> None:
    out = tmp_path / "affinity.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.affinity", *TINY, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["clean"], done.stdout
    off, on = results["runs"]["off"], results["runs"]["on"]
    assert (off["affinity"], on["affinity"]) == (False, True)
    for run in (off, on):
        assert run["ok"] == run["requests"] == 12 and run["errors"] == {}
        assert [t["requests"] for t in run["by_turn"]] == [4, 4, 4]
        assert run["placement"]["later_turns"] == 8
        assert sum(run["placement"]["requests_per_replica"]) == 12
        assert run["ttft_ms"]["p50"] > 0 and run["throughput_rps"] > 0
    # The same requests in both runs: the simulators were asked for the same prompt tokens.
    assert off["prefix_cache"]["queries_tokens"] == on["prefix_cache"]["queries_tokens"] > 0
    # With affinity every later turn ran where its previous turn did and found it all cached.
    assert on["placement"]["on_previous_turns_replica"] == 1.0
    assert on["placement"]["whole_history_cached"] == 1.0
    assert 0 < on["prefix_cache"]["hit_rate"] < 1
    assert results["effect"]["hit_rate"] == {
        "off": off["prefix_cache"]["hit_rate"],
        "on": on["prefix_cache"]["hit_rate"],
    }
    assert "affinity on: 12/12 ok" in done.stdout


def test_placement_counts_later_turns_home_and_with_their_history_cached() -> None:
    turns = [
        Turn(0, 0, "a0", prompt_tokens=40, completion_tokens=9, finish_reason="length"),
        Turn(0, 1, "a1", prompt_tokens=70, completion_tokens=9, finish_reason="stop"),
        Turn(0, 2, "a2", prompt_tokens=99),
        Turn(1, 0, "b0", prompt_tokens=40, completion_tokens=9, finish_reason="length"),
        Turn(1, 1, "b1", prompt_tokens=70),
        Turn(1, 2, "b2", error="http_502"),
    ]
    where = {
        "a0": (0, 0),
        "a1": (0, 48),  # 40 + 9 - 1 = 48 computed: all three blocks of 16 cached
        "a2": (0, 64),  # 70 + 9 = 79 computed: 4 blocks (64) needed, 64 found
        "b0": (1, 0),
        "b1": (0, 32),  # moved, and found only the shared part
    }
    assert placement(turns, where, 16) == {
        "later_turns": 3,
        "on_previous_turns_replica": round(2 / 3, 4),
        "whole_history_cached": round(2 / 3, 4),
        "requests_per_replica": [4, 1],
    }


def test_the_load_is_the_same_in_every_run() -> None:
    assert user_message(3, 2, (5, 9)) == user_message(3, 2, (5, 9))
    assert user_message(3, 2, (5, 9)) != user_message(3, 1, (5, 9))
