from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.model_file import load_classifier
from router.training import TrainConfig, evaluate, load_rows, train
from router.training.data import Row, group_key, is_validation, question_stem
from router.training.evaluate import choose_threshold, split_rows
from router.training.labels import BothWrong, LabelScheme, needs_large, targets
from tests.router.conftest import DATA_DIR


def mmlu(weak: bool, strong: bool) -> Row:
    return Row("mmlu_pro/1", "mmlu_pro", "Q?\nA. a\nB. b", weak_correct=weak, strong_correct=strong)


@pytest.mark.parametrize(
    ("row", "p", "weight"),
    [
        (mmlu(False, True), 1.0, 0.5),
        (mmlu(True, True), 0.0, 0.5),
        (mmlu(True, False), 0.0, 0.5),
        (Row("v/1", "vicuna_bench", "How are you?"), 0.0, 5.0),
        (Row("s/1", "self_instruct_seed_tasks", "Name a colour."), 0.0, 5.0),
        (Row("a/1", "arena_hard_v0.1", "Write a compiler."), 0.7, 2.0),
        (Row("a/2", "arena_hard_v2.0", "Write a sonnet.", category="creative_writing"), 0.5, 2.0),
        (Row("g/1", "gsm8k_train", "2+2?", solution_steps=2), 0.05, 0.2),
        (Row("g/2", "gsm8k_train", "long", solution_steps=9), 0.61, 0.2),
    ],
)
def test_label_scheme(row: Row, p: float, weight: float) -> None:
    (target,) = targets([row], LabelScheme())
    assert target.p == pytest.approx(p)
    assert target.weight == pytest.approx(weight)


def test_both_wrong_is_dropped_by_default_or_labelled_zero() -> None:
    row = mmlu(False, False)
    assert targets([row], LabelScheme()) == []
    (target,) = targets([row], LabelScheme(both_wrong=BothWrong.ZERO))
    assert (target.p, target.weight) == (0.0, 0.25)
    assert needs_large(row) is False
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
    assert [s[0] for s in stages] == ["load", "features", "fit", "evaluate", "save", "done"]
    assert stages[-1][1] == stages[-1][2]

    a, b = load_classifier(first.model_path), load_classifier(second.model_path)
    assert a.threshold == b.threshold == first.threshold
    prompts = [r.prompt for r in load_rows(DATA_DIR)[::500]]
    assert a.score_texts(prompts) == b.score_texts(prompts)

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
