from __future__ import annotations

import numpy as np
import pytest

from router.training.apgr import (
    bootstrap_interval,
    compare_routers,
    cost_quality_curve,
    length_scores,
)

WEAK = [0.0, 1.0, 0.0, 1.0, 0.0, 0.5]
STRONG = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("constant", [0.0, 0.3, 1.0])
def test_constant_score_gives_exactly_the_random_router(constant: float) -> None:
    curve = cost_quality_curve([constant] * len(WEAK), WEAK, STRONG)
    assert curve.apgr == pytest.approx(0.5, abs=1e-12)
    assert curve.cpt(0.5) == pytest.approx(0.5, abs=1e-12)
    assert curve.cpt(0.8) == pytest.approx(0.8, abs=1e-12)
    np.testing.assert_allclose(curve.pgr, curve.cost, atol=1e-12)


def test_curve_matches_the_definition_by_hand() -> None:
    # gains strong - weak: [1, 0, 1, -1, 0, 0.5]; total 1.5, N = 6, r_weak = 2.5 / 6
    scores = [0.9, 0.1, 0.8, 0.7, 0.2, 0.6]  # order: 0, 2, 3, 5, 4, 1
    curve = cost_quality_curve(scores, WEAK, STRONG)
    cumulative = np.array([0, 1, 2, 1, 1.5, 1.5, 1.5])
    np.testing.assert_allclose(curve.quality, (2.5 + cumulative) / 6)
    np.testing.assert_allclose(curve.pgr, cumulative / 1.5)
    expected = float(np.sum((cumulative[1:] + cumulative[:-1]) / 2 / 1.5) / 6)
    assert curve.apgr == pytest.approx(expected)
    # PGR is 2/3 after one prompt: 0.5 is reached 3/4 of the way through it, 0.8 at 1/5 of
    # the way through the second (the curve is linear between k and k + 1)
    assert curve.cpt(0.5) == pytest.approx(0.75 / 6)
    assert curve.cpt(0.8) == pytest.approx((1 + 0.2) / 6)


def test_ties_share_their_gain_whatever_the_input_order() -> None:
    scores = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    a = cost_quality_curve(scores, WEAK, STRONG)
    perm = [1, 0, 5, 4, 3, 2]
    b = cost_quality_curve(
        [scores[i] for i in perm], [WEAK[i] for i in perm], [STRONG[i] for i in perm]
    )
    np.testing.assert_allclose(a.pgr, b.pgr)
    assert a.pgr[1] == pytest.approx(0.5 / 1.5)  # half of the tie {gain 1, gain 0}


def test_oracle_beats_random_and_reverse_oracle_loses() -> None:
    rng = np.random.default_rng(1)
    weak = rng.integers(0, 2, 500).astype(float)
    strong = np.maximum(weak, rng.integers(0, 2, 500))
    gain = strong - weak
    assert cost_quality_curve(gain, weak, strong).apgr > 0.7
    assert cost_quality_curve(-gain, weak, strong).apgr < 0.3


def test_no_gap_gives_nan() -> None:
    curve = cost_quality_curve([0.1, 0.9], [1.0, 0.0], [1.0, 0.0])
    assert np.isnan(curve.apgr)
    assert np.isnan(curve.cpt(0.5))


def test_length_router_and_bootstrap() -> None:
    assert length_scores(["a", "abc", ""]).tolist() == [1.0, 3.0, 0.0]
    low, high = bootstrap_interval(lambda i: float(np.mean(i)), 1000, resamples=200, seed=3)
    assert low < 499.5 < high
    assert high - low < 60


def test_compare_routers_reports_paired_difference() -> None:
    rng = np.random.default_rng(2)
    weak = rng.integers(0, 2, 300).astype(float)
    strong = np.maximum(weak, rng.integers(0, 2, 300))
    result = compare_routers(
        {"oracle": strong - weak, "random": np.zeros(300)},
        weak,
        strong,
        resamples=100,
        baseline="random",
    )
    assert result["random"]["apgr"] == pytest.approx(0.5)
    assert result["oracle"]["apgr_minus_random"] == pytest.approx(result["oracle"]["apgr"] - 0.5)
    low, high = result["oracle"]["apgr_minus_random_ci95"]  # type: ignore[misc]
    assert 0 < low < high
    assert set(result["oracle"]) >= {"apgr", "cpt50", "cpt80", "apgr_ci95", "n"}
