from __future__ import annotations

import itertools

import numpy as np
import pytest

from router.classifier import CalibratedClassifier, threshold_for_share
from router.features import PromptFeatures
from router.model_file import load_classifier
from router.sklearn_classifier import SklearnClassifier
from router.training.data import load_rows
from router.training.evaluate import choose_threshold, share_curve, split_rows
from tests.router.conftest import DATA_DIR

CURVE = [0.9, 0.7, 0.4, 0.2, 0.0]  # shares 0, 0.25, 0.5, 0.75, 1


@pytest.mark.parametrize(
    ("share", "threshold"),
    [(0.0, 0.9), (0.25, 0.7), (0.5, 0.4), (0.625, 0.3), (1.0, 0.0), (-1.0, 0.9), (2.0, 0.0)],
)
def test_threshold_for_share_interpolates_and_clamps(share: float, threshold: float) -> None:
    assert threshold_for_share(CURVE, share) == pytest.approx(threshold)


def test_threshold_for_share_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="two points"):
        threshold_for_share([0.5], 0.3)
    with pytest.raises(ValueError, match="NaN"):
        threshold_for_share(CURVE, float("nan"))


def test_share_curve_is_non_increasing_and_agrees_with_the_threshold() -> None:
    scores = {"a": np.linspace(0, 1, 101), "b": np.zeros(10)}
    curve = share_curve(scores)
    assert len(curve) == 101
    assert all(x >= y for x, y in itertools.pairwise(curve))
    assert curve[40] == pytest.approx(choose_threshold(scores, 0.4), abs=1e-3)


def test_model_without_curve_says_so(tiny_classifier: SklearnClassifier) -> None:
    with pytest.raises(ValueError, match="share curve"):
        tiny_classifier.threshold_for_share(0.3)


def test_shipped_share_curve_sends_that_share_of_the_validation_mix_large() -> None:
    classifier = load_classifier()
    assert isinstance(classifier, CalibratedClassifier)
    assert classifier.threshold_for_share(0.4) == pytest.approx(classifier.threshold, abs=2e-3)
    _, validation = split_rows(load_rows(DATA_DIR), seed=0, fraction=0.2)
    by_group: dict[str, list[float]] = {}
    for row in validation[::3]:
        score = classifier.score(PromptFeatures.from_text(row.prompt))
        group = "mmlu" if row.source == "mmlu_pro" else row.source
        by_group.setdefault(group, []).append(score)
    mmlu = np.asarray(by_group["mmlu"])
    for share in (0.1, 0.3, 0.5, 0.8):
        threshold = classifier.threshold_for_share(share)
        assert 0.0 <= threshold <= 1.0
        # MMLU-Pro is a quarter of the mix: its share moves with the target, monotonically
        assert float(np.mean(mmlu >= threshold)) <= min(1.0, share * 4)
    shares = [float(np.mean(mmlu >= classifier.threshold_for_share(s))) for s in (0.1, 0.5, 0.9)]
    assert shares == sorted(shares) and shares[0] < shares[-1]
