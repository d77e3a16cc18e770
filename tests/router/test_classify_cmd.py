"""``tiergate classify`` and ``tiergate eval`` through the real CLI app (typer's runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli.main import app
from router.features import PromptFeatures
from router.model_file import load_classifier
from router.training.apgr import cost_quality_curve

PROMPTS = [
    "What is the capital of France?",
    "Prove that every bounded monotone sequence of reals converges.",
    "Write a haiku about spring",
    "Design a lock-free queue in C++ and prove it linearizable.",
]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def test_classify_adds_score_and_keeps_other_fields(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"id": i, "prompt": p, "extra": [i]} for i, p in enumerate(PROMPTS)
    ]
    rows.append({"id": "m", "messages": [{"role": "user", "content": PROMPTS[0]}]})
    source = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["classify", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    classifier = load_classifier()
    assert [r["id"] for r in written] == [0, 1, 2, 3, "m"]
    assert written[0]["extra"] == [0]
    for row, prompt in zip(written, PROMPTS, strict=False):
        assert row["score"] == classifier.score(PromptFeatures.from_text(prompt))
    assert written[4]["score"] == written[0]["score"]


def test_classify_names_the_bad_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "ok"}\n{"id": 2}\n', "utf-8")
    result = CliRunner().invoke(
        app, ["classify", "-i", str(source), "-o", str(tmp_path / "o.jsonl")]
    )
    assert result.exit_code == 2
    assert ":2:" in result.output


def test_eval_prints_json_per_router_and_writes_a_png(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = []
    for i in range(60):
        prompt = PROMPTS[i % 4] + " " * (i % 7)
        # the weak model fails the two long prompts: the prompt-length router is an oracle
        rows.append({"prompt": prompt, "weak_score": float(len(prompt) < 40), "strong_score": 1.0})
    source = _write(tmp_path / "eval.jsonl", rows)
    png = tmp_path / "curve.png"
    result = CliRunner().invoke(
        app, ["eval", "--input", str(source), "--json", "--plot", str(png), "--resamples", "50"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == {"classifier", "random", "prompt_length"}
    for metrics in report.values():
        assert {"apgr", "cpt50", "cpt80", "apgr_ci95"} <= set(metrics)
    assert report["random"]["apgr"] == pytest.approx(0.5)
    assert report["random"]["cpt50"] == pytest.approx(0.5)
    assert report["prompt_length"]["apgr"] == pytest.approx(1 - 0.5 * 30 / 60)
    assert report["prompt_length"]["cpt80"] == pytest.approx(0.8 * 30 / 60)
    classifier = load_classifier()
    scores = [classifier.score(PromptFeatures.from_text(str(r["prompt"]))) for r in rows]
    expected = cost_quality_curve(scores, [r["weak_score"] for r in rows], [1.0] * 60)  # type: ignore[misc]
    assert report["classifier"]["apgr"] == pytest.approx(expected.apgr)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    table = CliRunner().invoke(app, ["eval", "-i", str(source), "--resamples", "0"])
    assert table.exit_code == 0, table.output
    assert "prompt_length" in table.output and "APGR" in table.output


def test_eval_requires_both_scores(tmp_path: Path) -> None:
    source = _write(tmp_path / "e.jsonl", [{"prompt": "hi", "weak_score": 1}])
    result = CliRunner().invoke(app, ["eval", "-i", str(source)])
    assert result.exit_code == 2
    assert "strong_score" in result.output


def test_eval_without_a_quality_gap_prints_null_not_nan(tmp_path: Path) -> None:
    rows = [{"prompt": p, "weak_score": 1.0, "strong_score": 1.0} for p in PROMPTS]
    source = _write(tmp_path / "flat.jsonl", rows)
    result = CliRunner().invoke(app, ["eval", "-i", str(source), "--json", "--resamples", "20"])
    assert result.exit_code == 0, result.output
    assert "NaN" not in result.stdout
    assert json.loads(result.stdout)["classifier"]["apgr"] is None
