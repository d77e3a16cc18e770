from __future__ import annotations

import itertools

import numpy as np
import pytest

from router.classifier import CalibratedClassifier, threshold_for_share
from router.features import PromptFeatures
from router.model_file import load_classifier
from router.sklearn_classifier import SklearnClassifier
from router.training.data import load_rows
from router.training.evaluate import (
    MIX_WEIGHTS,
    choose_threshold,
    mix_group,
    share_curve,
    split_rows,
)
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
    """The share curve holds on the documented mix (MIX_WEIGHTS: everyday chat 40 %, …)."""
    classifier = load_classifier()
    assert isinstance(classifier, CalibratedClassifier)
    target = float(classifier.metadata["target_large_share"])
    assert classifier.threshold_for_share(target) == pytest.approx(classifier.threshold, abs=2e-3)
    _, validation = split_rows(load_rows(DATA_DIR), seed=0, fraction=0.2)
    by_group: dict[str, list[float]] = {}
    for row in validation[::2]:
        if mix_group(row) in MIX_WEIGHTS:
            score = classifier.score(PromptFeatures.from_text(row.prompt))
            by_group.setdefault(mix_group(row), []).append(score)
    assert set(by_group) == set(MIX_WEIGHTS)
    for share in (0.1, 0.3, 0.5, 0.8):
        threshold = classifier.threshold_for_share(share)
        assert 0.0 <= threshold <= 1.0
        mix = sum(
            MIX_WEIGHTS[g] * float(np.mean(np.asarray(v) >= threshold)) for g, v in by_group.items()
        )
        assert mix == pytest.approx(share, abs=0.05)
