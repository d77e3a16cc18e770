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
    SklearnClassifier,
    meta_tokens,
    model_text,
)
from router.features import HEAD_CHARS, TAIL_CHARS, PromptFeatures
from router.model_file import DEFAULT_MODEL_PATH, card_path, load_classifier
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
    assert plain.endswith("tgmup0 tgmnoopts tgmqty0 tgmfx0 tgmqm0")


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
    reference = shipped.score_texts([model_text(f) for f in features])
    fast = [shipped.score(f) for f in features]
    assert fast == pytest.approx(reference, abs=1e-9)


def test_unsupported_pipeline_falls_back_to_predict_proba() -> None:
    pipeline = Pipeline(
        [("vec", HashingVectorizer(n_features=2**8)), ("model", LogisticRegression())]
    )
    pipeline.fit(["easy one", "hard two", "easy three", "hard four"], [0, 1, 0, 1])
    classifier = SklearnClassifier(pipeline)
    assert not classifier.fast
    score = classifier.score(PromptFeatures.from_text("hard"))
    assert 0.0 <= score <= 1.0


def test_pipeline_without_positive_class_is_rejected() -> None:
    pipeline = Pipeline(
        [("vec", HashingVectorizer(n_features=2**8)), ("model", LogisticRegression())]
    )
    pipeline.fit(["a", "b"], ["x", "y"])
    with pytest.raises(ValueError, match="positive class"):
        SklearnClassifier(pipeline)


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
