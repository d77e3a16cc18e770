"""The shipped model on the obvious cases' holdout half (data/routing/obvious/, never trained on).

Hand-written easy prompts (greetings, thanks, trivial facts, conversions, rewrites and
summaries of long pasted texts) and hard ones (short proofs, algorithms, system design, hard
maths and code), length-balanced so that prompt length alone cannot pass. The model reads
the conversation as the gateway does (``PromptFeatures.from_messages``), and the tier is the
model's default threshold.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.features import PromptFeatures
from router.loader import load_serving_classifier
from router.training.evaluate import pairwise_auc

OBVIOUS = (
    Path(__file__).resolve().parents[2] / "data" / "routing" / "obvious" / "obvious_cases.jsonl"
)


def _cases(split: str) -> list[tuple[bool, float]]:
    classifier = load_serving_classifier()
    rows = [json.loads(line) for line in OBVIOUS.read_text("utf-8").splitlines() if line.strip()]
    return [
        (row["label"] == "hard", classifier.score(PromptFeatures.from_messages(row["messages"])))
        for row in rows
        if row["split"] == split
    ]


@pytest.fixture(scope="module")
def holdout() -> list[tuple[bool, float]]:
    cases = _cases("holdout")
    assert len(cases) >= 150 and sum(h for h, _ in cases) >= 75
    return cases


def test_hard_ranks_above_easy_on_the_holdout(holdout: list[tuple[bool, float]]) -> None:
    auc = pairwise_auc([s for h, s in holdout if h], [s for h, s in holdout if not h])
    assert auc >= 0.95, f"pairwise AUC {auc:.3f}"


def test_default_threshold_sends_few_easy_large_and_few_hard_small(
    holdout: list[tuple[bool, float]],
) -> None:
    threshold = load_serving_classifier().threshold
    assert threshold is not None
    easy = [s for h, s in holdout if not h]
    hard = [s for h, s in holdout if h]
    easy_large = sum(s >= threshold for s in easy) / len(easy)
    hard_small = sum(s < threshold for s in hard) / len(hard)
    assert easy_large <= 0.10, f"{easy_large:.1%} of easy prompts go large"
    assert hard_small <= 0.15, f"{hard_small:.1%} of hard prompts go small"
