from __future__ import annotations

import json
import statistics

import pytest
import sklearn
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from router.classifier import (
    Classifier,
    length_steps,
    model_text,
    model_text_of,
)
from router.experts import GAIN, MULTIPLE_CHOICE, OPEN, PROBABILITY, expert_for
from router.features import HEAD_CHARS, TAIL_CHARS, PromptFeatures
from router.model_file import DEFAULT_MODEL_PATH, card_path, load_classifier
from router.prompt_text import Normalised, normalise
from router.sklearn_classifier import SklearnClassifier, SklearnExpert
from router.training.data import load_rows
from tests.router.conftest import DATA_DIR, EASY, HARD


@pytest.fixture(scope="module")
def shipped() -> SklearnClassifier:
    return load_classifier()


def _tokens(text: str) -> list[str]:
    return model_text_of(text).split("\n", 1)[0].split()


def test_meta_tokens_describe_the_structure() -> None:
    tokens = _tokens("Which?\nA. x = 1 + 2\nB. def f(): return 1;")
    assert tokens[:2] == ["tgmkmc", "tgmwb0"]
    assert {"tgmcode", "tgmmath", "tgmlatin", "tgmonum2", "tgmqm1"} <= set(tokens)
    assert not any(t.startswith("tgmopts") for t in tokens)  # the option count is format
    plain = _tokens("tell me a story about a dragon please")
    assert plain[0] == "tgmktxt" and "tgmnocode" in plain and "tgmhard0" in plain


def test_size_tokens_count_numbers_and_sentences() -> None:
    problem = (
        "Tom has 12 apples. He gives 3.5 kg to Ann and 1,200 grams to Bob! "
        "How many are left? Answer in grams."
    )
    tokens = _tokens(problem)
    assert "tgmnn3" in tokens and "tgmss4" in tokens and "tgmqty1" in tokens
    many = " ".join(f"{n}." for n in range(40))
    assert "tgmnn8" in _tokens(many)


@pytest.mark.parametrize(
    ("chars", "steps"), [(0, 0), (15, 0), (16, 0), (32, 4), (64, 8), (10**6, 40)]
)
def test_length_steps_are_a_thermometer_per_kind(chars: int, steps: int) -> None:
    assert length_steps(chars) == steps
    assert length_steps(chars, "code") == 2 * steps
    tokens = _tokens("a" * chars)
    assert [t for t in tokens if t.startswith("tgmtxttick")] == [
        f"tgmtxttick{i}"
        for i in range(1, min(steps, length_steps(HEAD_CHARS + TAIL_CHARS + 3)) + 1)
    ]


QUESTION = "Which planet is the largest in the solar system?"
OPTIONS = ("Mars", "Jupiter", "Venus", "Earth")


@pytest.mark.parametrize(
    "dressed",
    [
        QUESTION + "\n" + "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(OPTIONS)),
        QUESTION
        + "\n"
        + "\n".join(f"({'ABCD'[i]}) {o}" for i, o in enumerate(OPTIONS))
        + "\nAnswer:",
        "Question: "
        + QUESTION
        + "\n"
        + "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(OPTIONS))
        + "\nAnswer with the letter of the correct option.",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        + QUESTION
        + "\n"
        + "\n".join(f"({'ABCD'[i]}) {o}" for i, o in enumerate(OPTIONS))
        + "\nAnswer:<|im_end|>\n<|im_start|>assistant\n",
        QUESTION + " (A) Mars (B) Jupiter (C) Venus (D) Earth",
    ],
)
def test_the_format_of_a_question_is_taken_off(dressed: str) -> None:
    assert normalise(dressed) == Normalised(QUESTION, OPTIONS)


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("hello", "tgmgreet"),
        ("Thank you so much!", "tgmgreet"),
        ("ok", "tgmgreet"),
        ("Convert 5 miles to kilometers.", "tgmtrivial"),
        ("What is the capital of Peru?", "tgmtrivial"),
        ("Summarize the following text:\n" + "Words and more words. " * 50, "tgmxform"),
        ("Prove that there are infinitely many primes.", "tgmhard1"),
        ("Implement a lock-free queue with memory ordering.", "tgmhard2"),
    ],
)
def test_intent_tokens(text: str, token: str) -> None:
    assert token in _tokens(text)


def test_long_prompts_are_clipped_to_head_and_tail() -> None:
    text = "h" * HEAD_CHARS + "m" * 10_000 + "t" * TAIL_CHARS
    clipped = model_text(PromptFeatures.from_text(text))
    body = clipped.split("\n", 1)[1]
    assert body == "h" * HEAD_CHARS + "\n…\n" + "t" * TAIL_CHARS


def test_sklearn_classifier_is_a_classifier(tiny_classifier: SklearnClassifier) -> None:
    assert isinstance(tiny_classifier, Classifier)


def test_fast_path_matches_the_pipeline_on_real_prompts(shipped: SklearnClassifier) -> None:
    assert shipped.fast
    rows = load_rows(DATA_DIR)[::97]
    features = [PromptFeatures.from_text(row.prompt) for row in rows]
    odd = ["", "🙂", "x" * 9000, "line one\nTGMcode tgmlen9 tgmopts4\nagain tgmmath", "a\ntgm"]
    features += [PromptFeatures.from_text(t) for t in [*EASY, *HARD, *odd]]
    assert {expert_for(f) for f in features} == {OPEN, MULTIPLE_CHOICE}
    reference = shipped.score_features(features)
    fast = [shipped.score(f) for f in features]
    assert fast == pytest.approx(reference, abs=1e-9)


def _unsupported_pipeline() -> Pipeline:
    pipeline = Pipeline(
        [("vec", HashingVectorizer(n_features=2**8)), ("model", LogisticRegression())]
    )
    pipeline.fit(["easy one", "hard two", "easy three", "hard four"], [0, 1, 0, 1])
    return pipeline


def test_unsupported_pipeline_falls_back_to_predict_proba() -> None:
    expert = SklearnExpert(_unsupported_pipeline(), PROBABILITY)
    classifier = SklearnClassifier({OPEN: expert, MULTIPLE_CHOICE: expert})
    assert not classifier.fast
    score = classifier.score(PromptFeatures.from_text("hard"))
    assert 0.0 <= score <= 1.0


def test_pipeline_without_positive_class_is_rejected() -> None:
    pipeline = Pipeline(
        [("vec", HashingVectorizer(n_features=2**8)), ("model", LogisticRegression())]
    )
    pipeline.fit(["a", "b"], ["x", "y"])
    with pytest.raises(ValueError, match="positive class"):
        SklearnExpert(pipeline, PROBABILITY)


def test_a_classifier_needs_every_expert() -> None:
    expert = SklearnExpert(_unsupported_pipeline(), PROBABILITY)
    with pytest.raises(ValueError, match="no expert multiple_choice"):
        SklearnClassifier({OPEN: expert})


def test_each_prompt_is_scored_by_its_experts_output(tiny_classifier: SklearnClassifier) -> None:
    mc = PromptFeatures.from_text("Which?\nA. 6\nB. 8\nC. 10")
    plain = PromptFeatures.from_text("Which is more, 6 or 8?")
    assert (expert_for(mc), expert_for(plain)) == (MULTIPLE_CHOICE, OPEN)
    mc_expert = tiny_classifier.experts[MULTIPLE_CHOICE]
    p = mc_expert.probability(model_text(mc))
    assert tiny_classifier.score(mc) == GAIN(p) == max(0.0, min(1.0, 2 * p - 1))
    open_expert = tiny_classifier.experts[OPEN]
    assert tiny_classifier.score(plain) == open_expert.probability(model_text(plain))
    assert tiny_classifier.score_features([mc, plain]) == pytest.approx(
        [tiny_classifier.score(mc), tiny_classifier.score(plain)], abs=1e-12
    )


def test_shipped_model_separates_easy_from_hard(shipped: SklearnClassifier) -> None:
    easy = [shipped.score(PromptFeatures.from_text(t)) for t in EASY]
    hard = [shipped.score(PromptFeatures.from_text(t)) for t in HARD]
    assert all(0.0 <= s <= 1.0 for s in easy + hard)
    assert statistics.mean(hard) > statistics.mean(easy) + 0.05


def test_shipped_model_has_a_card_that_matches_it(shipped: SklearnClassifier) -> None:
    card = json.loads(card_path(DEFAULT_MODEL_PATH).read_text("utf-8"))
    assert card["threshold"] == shipped.threshold
    assert 0.0 < card["threshold"] < 1.0
    assert card["versions"]["sklearn"].split(".")[:2] == sklearn.__version__.split(".")[:2]
    assert 0.3 <= card["metrics"]["large_share"]["mix"] <= 0.5
    assert card["model_bytes"] == DEFAULT_MODEL_PATH.stat().st_size
    assert DEFAULT_MODEL_PATH.stat().st_size < 3_000_000
