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
    meta_tokens,
    model_text,
)
from router.experts import GAIN, MULTIPLE_CHOICE, OPEN, PROBABILITY, expert_for
from router.features import HEAD_CHARS, TAIL_CHARS, PromptFeatures
from router.model_file import DEFAULT_MODEL_PATH, card_path, load_classifier
from router.sklearn_classifier import SklearnClassifier, SklearnExpert
from router.training.data import load_rows
from tests.router.conftest import DATA_DIR, EASY, HARD


@pytest.fixture(scope="module")
def shipped() -> SklearnClassifier:
    return load_classifier()


def test_meta_tokens_describe_the_structure() -> None:
    features = PromptFeatures.from_text("Which?\nA. x = 1 + 2\nB. def f(): return 1;")
    assert meta_tokens(features) == (
        "tgmlen1 tgmcode tgmmath tgmopts2 tgmlatin "
        "tgmup7 tgmomin2 tgmospr4 tgmonum2 tgmqty0 tgmfx0 tgmqm1"
    )
    plain = meta_tokens(PromptFeatures.from_text("tell me a story about a dragon please"))
    assert plain.endswith("tgmup0 tgmnoopts tgmqty0 tgmfx0 tgmqm0 tgmnn0 tgmwc3 tgmss0")


def test_size_tokens_count_numbers_words_and_sentences() -> None:
    problem = (
        "Tom has 12 apples. He gives 3.5 kg to Ann and 1,200 grams to Bob! "
        "How many are left? Answer in grams."
    )
    tokens = meta_tokens(PromptFeatures.from_text(problem)).split()
    # 3 numbers (1,200 is one); 21 words: 2·log2(21) = 8.8 → bucket 5; 4 sentence ends
    assert tokens[-3:] == ["tgmnn3", "tgmwc5", "tgmss4"]
    many = " ".join(f"{n}." for n in range(40))
    assert meta_tokens(PromptFeatures.from_text(many)).split()[-3:][0] == "tgmnn12"
    # a multiple-choice question's text has none: its expert reads the shape tokens
    question = PromptFeatures.from_text(problem + "\nA. 8,800\nB. 9,000\nC. 12")
    assert not any(t.startswith(("tgmnn", "tgmwc", "tgmss")) for t in meta_tokens(question).split())


@pytest.mark.parametrize(
    ("words", "bucket"), [(0, 0), (3, 0), (4, 1), (6, 2), (8, 3), (16, 5), (256, 13), (10**4, 16)]
)
def test_word_buckets(words: int, bucket: int) -> None:
    tokens = meta_tokens(PromptFeatures.from_text("w " * words)).split()
    assert tokens[-2] == f"tgmwc{bucket}"


@pytest.mark.parametrize(("chars", "bucket"), [(0, 0), (31, 0), (32, 1), (64, 2), (10**6, 10)])
def test_length_buckets(chars: int, bucket: int) -> None:
    assert meta_tokens(PromptFeatures.from_text("a" * chars)).startswith(f"tgmlen{bucket} ")


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
