from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from router.features import PromptFeatures
from router.model_file import load_classifier
from router.prompt_text import normalise
from router.training import TrainConfig, evaluate, load_rows, train
from router.training.data import DATA_FILES, Row, group_key, is_validation, question_stem, row_group
from router.training.evaluate import choose_threshold, split_rows
from router.training.labels import (
    OUTCOME_SOURCES,
    LabelScheme,
    format_variants,
    needs_large,
    targets,
    training_targets,
)
from tests.router.conftest import DATA_DIR


def mmlu(weak: bool, strong: bool, gain: float | None = 0.3) -> Row:
    return Row(
        "mmlu_pro/1",
        "mmlu_pro",
        "Q?\nA. a\nB. b",
        weak_correct=weak,
        strong_correct=strong,
        gain=gain,
    )


@pytest.mark.parametrize(
    ("row", "p", "weight"),
    [
        (mmlu(False, True), 0.3, 1.0),
        (mmlu(True, True, gain=0.05), 0.05, 1.0),
        (Row("z/1", "zeroeval_crux", "assert f(1) == ??", gain=0.4), 0.4, 1.0),
        (Row("v/1", "vicuna_bench", "How are you?"), 0.0, 3.0),
        (Row("s/1", "self_instruct_seed_tasks", "Name a colour."), 0.0, 3.0),
        (Row("a/1", "arena_hard_v0.1", "Write a compiler."), 0.5, 1.0),
        (
            Row("a/2", "arena_hard_v2.0", "Write a sonnet.", category="creative_writing"),
            0.3,
            1.0,
        ),
        (Row("g/1", "gsm8k_train", "2+2?", solution_steps=2), 0.03, 2.0),
        (Row("g/2", "gsm8k_train", "long", solution_steps=9), 0.38, 2.0),
        (Row("o/1", "obvious_cases", "hi", difficulty="easy", split="train"), 0.0, 5.0),
        (Row("o/2", "obvious_cases", "prove", difficulty="hard", split="train"), 0.6, 5.0),
    ],
)
def test_label_scheme(row: Row, p: float, weight: float) -> None:
    (target,) = targets([row], LabelScheme())
    assert target.p == pytest.approx(p)
    assert target.weight == pytest.approx(weight)


def test_holdout_obvious_cases_and_rows_without_a_gain_are_never_labelled() -> None:
    held = Row("o/3", "obvious_cases", "hello", difficulty="easy", split="holdout")
    assert targets([held, mmlu(True, False, gain=None)], LabelScheme()) == []
    assert needs_large(mmlu(False, True)) is True
    assert needs_large(mmlu(False, False)) is False
    assert needs_large(Row("x", "vicuna_bench", "hi")) is None


def test_outcome_files_carry_irt_gains_that_follow_the_llama_flags() -> None:
    rows = [r for r in load_rows(DATA_DIR) if r.source in OUTCOME_SOURCES]
    assert {r.source for r in rows} == OUTCOME_SOURCES
    assert all(r.gain is not None and 0.0 <= r.gain <= 1.0 for r in rows)
    only_70b = [r.gain or 0.0 for r in rows if r.strong_correct and not r.weak_correct]
    rest = [r.gain or 0.0 for r in rows if not (r.strong_correct and not r.weak_correct)]
    assert np.mean(only_70b) > np.mean(rest) + 0.05


def test_format_variants_keep_the_question_and_its_label() -> None:
    row = Row(
        "mmlu_pro/7", "mmlu_pro", "Q?\n" + "\n".join(f"{c}. o{c}" for c in "ABCDEFGHIJ"), gain=0.2
    )
    (variant,) = format_variants(row)
    assert variant.id == "mmlu_pro/7~4"
    lines = variant.prompt.split("\n")
    assert lines[0] == "Q?" and len([x for x in lines if x[:3] in ("(A)", "A) ")]) == 1
    assert len(normalise(variant.prompt).options) == 4
    labelled = training_targets([row], LabelScheme())
    assert [t.p for t in labelled] == [0.2, 0.2] and [t.weight for t in labelled] == [1.0, 0.5]


def test_group_key_ignores_options_case_and_punctuation() -> None:
    a = "What is 2 + 2?\nA. 3\nB. 4"
    b = "what is 2+2 ?\nA. 4\nB. 5\nC. 6"
    assert question_stem(a) == "What is 2 + 2?"
    assert group_key(a) == group_key(b)
    passage = "A long shared passage about gases. " * 10
    assert group_key(passage + "Question one?") == group_key(passage + "Question two?")


def test_split_is_stable_and_roughly_the_asked_fraction() -> None:
    keys = [f"question {i}" for i in range(4000)]
    first = [is_validation(k, seed=0, fraction=0.2) for k in keys]
    assert first == [is_validation(k, seed=0, fraction=0.2) for k in keys]
    assert 0.17 < sum(first) / len(keys) < 0.23
    assert first != [is_validation(k, seed=1, fraction=0.2) for k in keys]


def test_no_question_group_is_on_both_sides() -> None:
    train_rows, validation = split_rows(load_rows(DATA_DIR), seed=0, fraction=0.2)
    assert not {row_group(r) for r in train_rows} & {row_group(r) for r in validation}
    assert {r.split for r in validation if r.source == "obvious_cases"} == {"holdout"}


def test_threshold_hits_the_share_of_an_equal_weight_mix() -> None:
    scores = {"a": np.linspace(0, 1, 101), "b": np.zeros(10)}
    # half the mix is "b" (all 0), so 40 % of the mix must come from the top 80 % of "a"
    threshold = choose_threshold(scores, 0.4)
    assert threshold == pytest.approx(0.2, abs=0.011)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_is_reproducible(tmp_path: Path) -> None:
    """Three trainings, each fitting the outcome files' IRT models: slow (about a minute)."""
    config = TrainConfig(max_rows_per_source=120, bootstrap_resamples=50)
    stages: list[tuple[str, int, int]] = []
    first = train(
        DATA_DIR, tmp_path / "a.skops", seed=3, progress=lambda *s: stages.append(s), config=config
    )
    second = train(DATA_DIR, tmp_path / "b.skops", seed=3, config=config)
    assert first.evaluation == second.evaluation
    assert [s[0] for s in stages] == ["load", "fit", "evaluate", "save", "done"]
    assert stages[-1][1] == stages[-1][2]

    a, b = load_classifier(first.model_path), load_classifier(second.model_path)
    assert a.threshold == b.threshold == first.threshold
    features = [PromptFeatures.from_text(r.prompt) for r in load_rows(DATA_DIR)[::500]]
    assert a.score_features(features) == b.score_features(features)

    card = json.loads(first.card_path.read_text("utf-8"))
    assert card["threshold"] == first.threshold
    assert card["seed"] == 3
    assert card["metrics"] == first.evaluation.to_dict()
    assert set(card["training"]["data_sha256"]) == set(DATA_FILES)

    other = train(DATA_DIR, tmp_path / "c.skops", seed=4, config=config)
    assert other.evaluation != first.evaluation


def test_evaluate_reproduces_the_shipped_card() -> None:
    classifier = load_classifier()
    card = json.loads(
        (Path(__file__).resolve().parents[2] / "router/models/complexity.json").read_text()
    )
    report = evaluate(classifier, DATA_DIR)
    assert report.to_dict() == card["metrics"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiergate_train_reproduces_the_shipped_model(tmp_path: Path) -> None:
    """What a reviewer does from a clean clone: `tiergate train` gives the shipped card's
    validation metrics and a model that scores as the shipped one does. In a process of its
    own, as a reviewer runs it: the command pins OpenBLAS's and numpy's CPU kernels before
    numpy loads (left to choose, both run AVX-512 code on a CPU that has it, and that trains a
    model that differs in the third or fourth decimal)."""
    out = tmp_path / "complexity.skops"
    pins = ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")
    env = {k: v for k, v in os.environ.items() if k not in pins}
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "train", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=850,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MMLU-Pro APGR" in result.stdout
    assert "GSM8K Spearman" in result.stdout
    assert "not pinned" not in result.stdout
    shipped_card = json.loads(
        (Path(__file__).resolve().parents[2] / "router/models/complexity.json").read_text()
    )
    card = json.loads(out.with_suffix(".json").read_text("utf-8"))
    assert card["metrics"] == shipped_card["metrics"]
    assert card["config"] == shipped_card["config"]
    features = [PromptFeatures.from_text(r.prompt) for r in load_rows(DATA_DIR)[::97]]
    assert load_classifier(out).score_features(features) == pytest.approx(
        load_classifier().score_features(features), abs=1e-12
    )
