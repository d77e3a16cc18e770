"""A replay's ``Prediction`` sums its rows as a cost report sums ledger rows: cost over the
priced rows, baseline over the rows that have one, a saving only where both are known."""

from __future__ import annotations

import pytest

from gateway.rules.replay import Prediction, Routed

ROWS = [
    Routed("large", 300, 300, "rule:hard"),
    Routed("small", 20, 300, "auto:threshold"),
    Routed("small", None, 300, "auto:threshold"),  # price unknown: no cost, no saving
    Routed("small", 20, None, "auto:threshold"),  # no baseline: cost, no saving
]


@pytest.mark.parametrize(
    ("rows", "refused", "want"),
    [
        ([], 0, (0, 0, 0, 0, 0, 0, 0, {})),
        (ROWS[:1], 0, (1, 300, 300, 0, 0, 1, 0, {"rule:hard": 1})),
        (ROWS, 2, (4, 340, 900, 280, 1, 1, 2, {"rule:hard": 1, "auto:threshold": 3})),
    ],
    ids=["none", "one large", "mixed"],
)
def test_prediction_sums(rows: list[Routed], refused: int, want: tuple[object, ...]) -> None:
    refusals = [Routed(None, None, 300, "refused")] * refused  # counted, not summed
    p = Prediction.of([*rows, *refusals])
    s = p.sums
    got = (
        s.requests,
        s.cost_micro_usd,
        s.baseline_micro_usd,
        s.savings_micro_usd,
        s.unknown_price,
        p.large,
        p.refused,
        dict(p.by_rule),
    )
    assert got == want
