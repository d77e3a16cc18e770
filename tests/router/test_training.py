from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.experts import MULTIPLE_CHOICE, OPEN
from router.features import PromptFeatures
from router.model_file import load_classifier
from router.training import TrainConfig, evaluate, load_rows, train
from router.training.data import Row, group_key, is_validation, question_stem
from router.training.evaluate import choose_threshold, split_rows
from router.training.labels import LabelScheme, expert_targets, needs_large, targets
from tests.router.conftest import DATA_DIR


def mmlu(weak: bool, strong: bool) -> Row:
    return Row("mmlu_pro/1", "mmlu_pro", "Q?\nA. a\nB. b", weak_correct=weak, strong_correct=strong)


@pytest.mark.parametrize(
    ("row", "p", "weight", "expert"),
    [
        (mmlu(False, True), 1.0, 1.0, MULTIPLE_CHOICE),
        (mmlu(True, True), 0.5, 1.0, MULTIPLE_CHOICE),
        (mmlu(False, False), 0.5, 1.0, MULTIPLE_CHOICE),
        (mmlu(True, False), 0.0, 1.0, MULTIPLE_CHOICE),
        (Row("v/1", "vicuna_bench", "How are you?"), 0.0, 5.0, OPEN),
        (Row("s/1", "self_instruct_seed_tasks", "Name a colour."), 0.0, 5.0, OPEN),
        (Row("a/1", "arena_hard_v0.1", "Write a compiler."), 0.7, 2.0, OPEN),
        (
            Row("a/2", "arena_hard_v2.0", "Write a sonnet.", category="creative_writing"),
            0.5,
            2.0,
            OPEN,
        ),
        (Row("g/1", "gsm8k_train", "2+2?", solution_steps=2), 0.05, 2.0, OPEN),
        (Row("g/2", "gsm8k_train", "long", solution_steps=9), 0.61, 2.0, OPEN),
    ],
)
def test_label_scheme(row: Row, p: float, weight: float, expert: str) -> None:
    (target,) = targets([row], LabelScheme())
    assert target.p == pytest.approx(p)
    assert target.weight == pytest.approx(weight)
    assert target.expert == expert


def test_outcome_rows_teach_the_multiple_choice_expert_and_weak_labels_the_open_one() -> None:
    rows = load_rows(DATA_DIR)[::50]
    by_expert = expert_targets(rows, LabelScheme())
    assert {t.row.source for t in by_expert[MULTIPLE_CHOICE]} == {"mmlu_pro"}
    assert "mmlu_pro" not in {t.row.source for t in by_expert[OPEN]}
    assert sum(map(len, by_expert.values())) == len(targets(rows, LabelScheme()))
    # by source, not by the gate: most, not all, of the outcome rows have options it finds
    found = [PromptFeatures.from_text(t.row.prompt).has_options for t in by_expert[MULTIPLE_CHOICE]]
    assert 0.9 < sum(found) / len(found) < 1.0
    assert needs_large(mmlu(False, True)) is True
    assert needs_large(mmlu(False, False)) is False
    assert needs_large(Row("x", "vicuna_bench", "hi")) is None


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
    assert not {group_key(r.prompt) for r in train_rows} & {group_key(r.prompt) for r in validation}


def test_threshold_hits_the_share_of_an_equal_weight_mix() -> None:
    scores = {"a": np.linspace(0, 1, 101), "b": np.zeros(10)}
    # half the mix is "b" (all 0), so 40 % of the mix must come from the top 80 % of "a"
    threshold = choose_threshold(scores, 0.4)
    assert threshold == pytest.approx(0.2, abs=0.011)


def test_training_is_reproducible(tmp_path: Path) -> None:
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
    assert set(card["training"]["data_sha256"]) == {p.name for p in DATA_DIR.glob("*.jsonl*")}

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
def test_tiergate_train_reproduces_the_shipped_model(tmp_path: Path) -> None:
    """What a reviewer does from a clean clone: `tiergate train` gives the shipped card's
    validation metrics and a model that scores as the shipped one does."""
    from typer.testing import CliRunner

    from gateway.cli.main import app

    out = tmp_path / "complexity.skops"
    result = CliRunner().invoke(app, ["train", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "MMLU-Pro APGR" in result.output
    assert "GSM8K Spearman" in result.output
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
