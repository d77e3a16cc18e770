"""Fixed wall-clock latencies (``--ttft-ms`` / ``--itl-ms``): a paced stream at time scale 0, as
the overhead bench needs, and the CLI flags that reach ``run_sim``."""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from backends.sim import PROFILES, create_sim_app
from gateway.cli.main import app as cli_app
from tests.backends.conftest import SMALL, StartSim

MESSAGES = [{"role": "user", "content": "Pace this answer, please."}]


async def test_stream_is_paced_at_the_fixed_itl_at_time_scale_zero(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=0.0, ttft_ms=40, itl_ms=25)
    body = {"model": SMALL, "messages": MESSAGES, "max_tokens": 6, "stream": True}
    arrivals: list[float] = []
    sent = time.perf_counter()
    async with sim.http.post(f"{sim.base_url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                choices = orjson.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    arrivals.append(time.perf_counter())
    assert len(arrivals) == 6
    assert arrivals[0] - sent >= 0.038
    # Token k is due at TTFT + k x ITL (never early by more than the 2 ms sleep threshold; a
    # late one does not delay the next), so bounds hold on the span, the median gap on pacing.
    gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))
    assert arrivals[-1] - sent >= 0.040 + 5 * 0.025 - 0.003, gaps
    assert 0.020 <= gaps[2] < 0.25, gaps


async def test_completion_waits_ttft_plus_itl_per_further_token(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=0.0, ttft_ms=30, itl_ms=10)
    started = time.perf_counter()
    resp = await sim.post_chat({"model": SMALL, "messages": MESSAGES, "max_tokens": 5})
    assert resp.status == 200
    assert time.perf_counter() - started >= 0.030 + 4 * 0.010 - 0.002


async def test_without_overrides_time_scale_zero_answers_at_once(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=0.0)
    started = time.perf_counter()
    resp = await sim.post_chat({"model": SMALL, "messages": MESSAGES, "max_tokens": 50})
    assert resp.status == 200
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("bad", [{"itl_ms": -1.0}, {"ttft_ms": float("nan")}])
def test_bad_fixed_latency_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be a finite number"):
        create_sim_app(PROFILES[SMALL], **bad)


def test_cli_passes_the_fixed_latencies_and_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run_sim(profile: str, **kwargs: Any) -> None:
        seen.update(kwargs, profile=profile)

    monkeypatch.setattr("backends.sim.run_sim", fake_run_sim)
    args = ["sim", "--profile", SMALL, "--port", "9", "--time-scale", "0"]
    args += ["--itl-ms", "50", "--ttft-ms", "5", "--max-num-seqs", "256"]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    assert seen["itl_ms"] == 50 and seen["ttft_ms"] == 5 and seen["max_num_seqs"] == 256
    assert seen["time_scale"] == 0


def test_cli_defaults_keep_the_profile_latency_model(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr("backends.sim.run_sim", lambda profile, **kw: seen.update(kw))
    result = CliRunner().invoke(cli_app, ["sim", "--profile", SMALL, "--port", "9"])
    assert result.exit_code == 0, result.output
    assert seen["itl_ms"] is None and seen["ttft_ms"] is None and seen["max_num_seqs"] is None
