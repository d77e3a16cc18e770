"""The gate between the experts and their output maps."""

from __future__ import annotations

import math

import pytest

from router.experts import GAIN, MULTIPLE_CHOICE, OPEN, PROBABILITY, Output, expert_for
from router.features import PromptFeatures


@pytest.mark.parametrize(
    ("prompt", "expert"),
    [
        ("Which gas?\nA. Oxygen\nB. Nitrogen", MULTIPLE_CHOICE),
        ("Pick one:\n(A) 22.2 m/s\n(B) 80 m/s\n(C) 33.3 m/s", MULTIPLE_CHOICE),
        ("Which is prime?\nA: 21\nB: 23\nC: 25", MULTIPLE_CHOICE),
        ("Q: what is 2 + 2?\nA: 4", OPEN),  # a question and its answer are not options
        ("Which gas?\nA. Oxygen", OPEN),  # one option is not a choice
        ("Natalia sold clips to 48 of her friends in April. How many in all?", OPEN),
        ("Write a haiku about spring", OPEN),
        ("", OPEN),
    ],
)
def test_the_gate_goes_by_multiple_choice_options(prompt: str, expert: str) -> None:
    assert expert_for(PromptFeatures.from_text(prompt)) == expert


def test_the_gate_reads_the_last_user_message() -> None:
    features = PromptFeatures.from_messages(
        [
            {"role": "user", "content": "Which gas?\nA. Oxygen\nB. Nitrogen"},
            {"role": "assistant", "content": "B"},
            {"role": "user", "content": "Why?"},
        ]
    )
    assert expert_for(features) == OPEN


@pytest.mark.parametrize(
    ("p", "gain"), [(0.0, 0.0), (0.4, 0.0), (0.5, 0.0), (0.6, 0.2), (0.75, 0.5), (1.0, 1.0)]
)
def test_the_gain_map_turns_the_label_probability_into_the_expected_gain(
    p: float, gain: float
) -> None:
    assert GAIN(p) == pytest.approx(gain, abs=1e-12)
    assert PROBABILITY(p) == p


@pytest.mark.parametrize(
    ("scale", "offset"), [(0.0, 0.0), (-1.0, 0.0), (math.inf, 0.0), (1.0, math.nan)]
)
def test_bad_output_maps_are_refused(scale: float, offset: float) -> None:
    with pytest.raises(ValueError, match="bad output map"):
        Output(scale=scale, offset=offset)
