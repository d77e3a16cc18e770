"""``target_large_share`` on the tenant's own scores (``router.share``, ``Signals.own_scores``)."""

from __future__ import annotations

import math
import random

import pytest

from router.catalog import Signals, Tier
from router.plan import RoutePlan
from router.share import ScoreQuantiles, ShareCurve, quantile_table
from tests.router.test_rules import Calibrated, FixedScore, one_rule, plan


def table(scores: list[float]) -> ScoreQuantiles:
    return ScoreQuantiles(quantile_table(scores), len(scores), 7.0)


def share_above(scores: list[float], threshold: float) -> float:
    return sum(s >= threshold for s in scores) / len(scores)


@pytest.mark.parametrize(
    ("scores", "q", "expected"),
    [
        ([0.5], 0.3, 0.5),
        ([0.0, 1.0], 0.25, 0.25),
        ([0.3, 0.1, 0.2], 0.5, 0.2),
        ([0.3, 0.1, 0.2], 0.0, 0.1),
        ([0.3, 0.1, 0.2], 1.0, 0.3),
        ([0.0, 0.0, 0.0, 1.0], 0.5, 0.0),
    ],
)
def test_quantile_table_interpolates_sorted_scores(
    scores: list[float], q: float, expected: float
) -> None:
    points = quantile_table(scores)
    assert len(points) == 101
    assert points[round(q * 100)] == pytest.approx(expected)


def test_quantile_table_refuses_nothing_and_bad_tables() -> None:
    with pytest.raises(ValueError, match="no scores"):
        quantile_table([])
    with pytest.raises(ValueError, match="non-decreasing"):
        ScoreQuantiles((0.5, 0.4), 2, 7.0)


@pytest.mark.parametrize("share", [0.05, 0.1, 0.3, 0.5, 0.7, 0.95])
@pytest.mark.parametrize("seed", [1, 2])
def test_threshold_for_share_holds_on_the_scores_it_was_made_from(share: float, seed: int) -> None:
    rng = random.Random(seed)
    scores = [rng.betavariate(5, 1.5) for _ in range(2000)]  # mostly high: an exam-heavy tenant
    threshold = table(scores).threshold_for_share(share)
    assert share_above(scores, threshold) == pytest.approx(share, abs=0.01)


@pytest.mark.parametrize(("share", "large"), [(0.0, 0.0), (-1.0, 0.0), (1.0, 1.0), (2.0, 1.0)])
def test_threshold_for_share_clamps_and_zero_sends_none(share: float, large: float) -> None:
    scores = [0.1, 0.4, 0.9]
    assert share_above(scores, table(scores).threshold_for_share(share)) == large
    with pytest.raises(ValueError, match="NaN"):
        table(scores).threshold_for_share(math.nan)


HIGH = [0.6 + 0.4 * i / 999 for i in range(1000)]  # the tenant's own scores: 0.6 … 1.0
SHARE = one_rule("{}", "{target_large_share: 0.3}")  # the mix (Calibrated): threshold 0.7


@pytest.mark.parametrize(
    ("own", "minimum", "curve", "threshold"),
    [
        (table(HIGH), 200, ShareCurve.TENANT, 0.88),  # its own 70th percentile
        (table(HIGH), 1000, ShareCurve.TENANT, 0.88),  # exactly the minimum
        (table(HIGH), 1001, ShareCurve.MIX, 0.7),  # one short
        (table(HIGH[:150]), 200, ShareCurve.MIX, 0.7),  # a new tenant
        (None, 200, ShareCurve.MIX, 0.7),  # nothing scored yet
    ],
)
def test_target_share_uses_the_tenants_scores_once_it_has_enough(
    own: ScoreQuantiles | None, minimum: int, curve: ShareCurve, threshold: float
) -> None:
    signals = Signals(own_scores=own, min_own_scores=minimum)
    result = plan(SHARE, classifier=Calibrated(0.8), signals=signals)
    assert result.threshold == pytest.approx(threshold, abs=0.001)
    assert result.share_source is not None
    assert result.share_source.curve is curve
    assert result.share_source.scores == (None if own is None else own.count)
    # 0.8 is large on the mix (≥ 0.7) but small on this tenant's own curve (< 0.88)
    assert result.tier is (Tier.SMALL if curve is ShareCurve.TENANT else Tier.LARGE)
    said = "the tenant's own last 1000 scores" if curve is ShareCurve.TENANT else "documented mix"
    assert said in result.reason
    assert RoutePlan.from_dict(result.to_dict()) == result


def test_only_target_share_reads_the_tenants_scores() -> None:
    signals = Signals(own_scores=table(HIGH), min_own_scores=200)
    fixed = plan(one_rule("{}", "{threshold: 0.3}"), classifier=Calibrated(0.5), signals=signals)
    assert (fixed.threshold, fixed.share_source, fixed.tier) == (0.3, None, Tier.LARGE)
    no_rule = plan("rules: []", classifier=Calibrated(0.5), signals=signals)
    assert (no_rule.threshold, no_rule.share_source) == (0.5, None)


def test_a_classifier_without_a_curve_still_uses_the_tenants_scores() -> None:
    own = plan(SHARE, classifier=FixedScore(0.9), signals=Signals(own_scores=table(HIGH)))
    assert own.threshold == pytest.approx(0.88, abs=0.001)
    kept = plan(SHARE, classifier=FixedScore(0.9), signals=Signals())
    assert (kept.threshold, kept.share_source) == (0.5, None)  # the tenant's threshold
