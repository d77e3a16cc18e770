"""A short chaos run (bench/chaos.py): backends killed, restarted and faulted at random under
steady load. Nothing may be lost or billed twice, and the quiet phase must be healthy."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("tiergate_chaos_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_chaos_loses_nothing_and_bills_nothing_twice() -> None:
    bench = _bench()
    args = argparse.Namespace(
        chaos_s=30.0, after_s=10.0, concurrency=6, seed=7, workers=0, requests=0, workdir=None
    )
    report = await bench.main_async(args)
    assert report["lost"] == 0, report
    assert report["double_billed"] == 0, report
    assert report["token_mismatch"] == 0, report["token_mismatch_examples"]
    assert report["chaos"]["requests"] > 50
    assert report["after"]["success_rate"] >= 0.95, report
