"""Hostile prompts: the shipped model returns a score in [0, 1], without raising, every time."""

from __future__ import annotations

import math
import random

import pytest

from router.classifier import HashedLinearClassifier
from router.features import PromptFeatures
from router.loader import load_serving_classifier
from router.model_file import load_classifier
from router.sklearn_classifier import SklearnClassifier


@pytest.fixture(scope="module", params=["serving export", "skops"])
def shipped(request: pytest.FixtureRequest) -> HashedLinearClassifier | SklearnClassifier:
    if request.param == "skops":
        return load_classifier()
    classifier = load_serving_classifier()
    assert isinstance(classifier, HashedLinearClassifier)
    return classifier


def _junk(n: int) -> str:
    rng = random.Random(5)
    return bytes(rng.randrange(256) for _ in range(n)).decode("latin-1")


def _conversation(turns: int) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: what is {i} + {i}?"})
        messages.append({"role": "assistant", "content": f"{2 * i}"})
    messages.append({"role": "user", "content": "Now prove the sum of all of them is even."})
    return messages


PROMPTS = {
    "empty": PromptFeatures.from_text(""),
    "whitespace": PromptFeatures.from_text(" \n\t " * 50),
    "200k characters": PromptFeatures.from_text("Explain this log line. " * 9_000),
    "200k one word": PromptFeatures.from_text("x" * 200_000),
    "chinese": PromptFeatures.from_text("请证明:对于所有正整数 n, n^3 - n 能被 6 整除。"),
    "russian": PromptFeatures.from_text("Объясните, как работает сборщик мусора в Java."),
    "arabic": PromptFeatures.from_text("ما هي عاصمة فرنسا؟"),
    "emoji": PromptFeatures.from_text("🙂🔥💯 " * 100),
    "binary junk": PromptFeatures.from_text(_junk(20_000)),
    "nul bytes": PromptFeatures.from_text("\x00" * 5_000),
    "lone surrogates": PromptFeatures.from_text("abc\ud800def\udfff"),
    "500 turns": PromptFeatures.from_messages(_conversation(500)),
    "no user message": PromptFeatures.from_messages([{"role": "system", "content": "hi"}]),
    "no messages": PromptFeatures.from_messages([]),
    "odd content": PromptFeatures.from_messages(
        [{"role": "user", "content": [{"type": "image_url"}, 3, None, {"type": "text"}]}]
    ),
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_score_in_the_unit_interval_comes_back(
    shipped: HashedLinearClassifier | SklearnClassifier, name: str
) -> None:
    score = shipped.score(PROMPTS[name])
    assert isinstance(score, float)
    assert math.isfinite(score)
    assert 0.0 <= score <= 1.0


def test_long_conversation_is_sized_in_full_but_scored_on_its_last_message() -> None:
    features = PROMPTS["500 turns"]
    assert features.n_turns == 501
    assert features.last_user_text.startswith("Now prove")
    assert features.estimated_prompt_tokens > 8_000
