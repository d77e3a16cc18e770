"""Complexity classifiers: one score in [0, 1], the large model's expected gain over the small.

A model file holds one scikit-learn ``Pipeline`` (under both expert names of
``router.experts``, which since model text v4 serve the same model) that takes *model text*: a
line of structural tokens, then the last user message, clipped and with its format taken off
(``router.prompt_text.normalise``: chat template, headers, option letters, answer scaffolding).
The tokens (``meta_tokens``) are the kind of prompt, a per-kind length thermometer (the blend
with prompt length, ``router.training.blend``), code / maths / script flags, the options' and
stem's shape, and hand features (``router.prompt_text.intent_tokens``). Putting them into the
text keeps the pipeline made of stock scikit-learn parts only, so the model file needs no custom
code to load. ``model_text`` is the one place that text is built, for training and for scoring
alike; changing it changes what a model file means, so bump ``MODEL_TEXT_VERSION`` when you do.

``HashedLinearClassifier`` (here) serves the model from the serving export without
scikit-learn; ``router.sklearn_classifier.SklearnClassifier`` wraps the fitted pipelines for
training, evaluation and the start-up fallback.

Calibration: scores are a ranking, not probabilities. A model file records its **share curve**
(``share_thresholds``): for each target share of traffic to the large tier, 0 %, 1 %, …, 100 %,
the score threshold at which that share of the documented validation mix
(``router.training.evaluate.MIX_WEIGHTS``: everyday chat 40 %, arena-hard 20 %, MMLU-Pro,
GSM8K, MATH and CRUXEval 10 % each) scores at or above it. ``threshold_for_share`` interpolates
it; a tenant's ``large_share: 0.3`` becomes ``classifier.threshold_for_share(0.3)``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from router.experts import Output, expert_for, missing_experts
from router.features import PromptFeatures, clip
from router.prompt_text import Normalised, intent_tokens, normalise
from router.scorer import HashedLinearScorer

__all__ = [
    "META_PREFIX",
    "META_TOKEN_PATTERN",
    "MODEL_TEXT_VERSION",
    "CalibratedClassifier",
    "Classifier",
    "ExpertModel",
    "HashedExpert",
    "HashedLinearClassifier",
    "ModelMetadata",
    "meta_tokens",
    "model_text",
    "model_text_of",
    "threshold_for_share",
]

MODEL_TEXT_VERSION = 4
META_PREFIX = "tgm"
"""Structural tokens start with this; the word vectorizer skips them, the meta one keeps them."""
META_TOKEN_PATTERN = rf"\b{META_PREFIX}\w+\b"
"""The meta vectorizer's token pattern: only structural tokens match it."""


@runtime_checkable
class Classifier(Protocol):
    """Scores a prompt in [0, 1]: higher when the large model is more likely to be needed."""

    def score(self, features: PromptFeatures) -> float: ...


@runtime_checkable
class CalibratedClassifier(Classifier, Protocol):
    """A classifier that can turn a target share of large-tier traffic into a threshold."""

    def threshold_for_share(self, share: float) -> float: ...


def threshold_for_share(curve: Sequence[float], share: float) -> float:
    """The threshold that sends ``share`` of traffic large, from an evenly spaced share curve.

    ``curve[i]`` is the threshold for share ``i / (len(curve) - 1)`` (non-increasing); values
    between are interpolated linearly; ``share`` is clamped to [0, 1]. Pure, O(1).
    """
    if len(curve) < 2:
        raise ValueError("a share curve needs at least two points")
    if math.isnan(share):
        raise ValueError("share is NaN")
    position = min(1.0, max(0.0, share)) * (len(curve) - 1)
    low = min(int(position), len(curve) - 2)
    fraction = position - low
    return float(curve[low] + fraction * (curve[low + 1] - curve[low]))


MEAN_OPTION_EDGES = (4, 8, 15, 25, 40, 70)
OPTION_MIN_EDGES = (4, 6, 10, 16, 25, 40, 59)
OPTION_SPREAD_EDGES = (0.3, 0.5, 1.25, 3.4, 6.8, 12.0, 20.0)
UPPER_SHARE_EDGES = (0.009, 0.015, 0.023, 0.045)
"""Bucket edges of the option and stem tokens (from the MMLU-Pro training questions)."""


def word_bucket(words: int) -> int:
    """0 for fewer than 2 words, then one bucket per half doubling (2, 3, 4, 6, 8, 12, …)."""
    if words < 2:
        return 0
    return min(14, int(2 * math.log2(words)) - 1)


LENGTH_DOUBLINGS = 10
"""The length thermometer covers 16 to 16k characters (ten doublings)."""
STEPS_PER_DOUBLING = {"mc": 4, "code": 8, "math": 4, "txt": 4}
"""Its resolution per kind: a step per quarter doubling (16, 19, 22, 27, 32, … characters), an
eighth for code, whose score leans on length most (``router.training.train.LENGTH_SLOPES``)."""


def max_steps(kind: str) -> int:
    return LENGTH_DOUBLINGS * STEPS_PER_DOUBLING[kind]


def length_steps(chars: int, kind: str = "txt") -> int:
    """Steps of ``kind``'s length thermometer for a body of ``chars`` characters (0 below 16)."""
    if chars < 16:
        return 0
    return min(max_steps(kind), int(STEPS_PER_DOUBLING[kind] * math.log2(chars / 16)))


def kind_of(normalised: Normalised, code: bool, maths: bool) -> str:
    """``mc`` (options), ``math`` (maths with LaTeX, whose braces look like code to
    ``has_code``), ``code``, ``math`` or ``txt``: whose length slope a prompt gets."""
    if len(normalised.options) >= 2:
        return "mc"
    if maths and ("\\" in normalised.stem or "$" in normalised.stem):
        return "math"
    return "code" if code else "math" if maths else "txt"


def _option_tokens(options: Sequence[str]) -> list[str]:
    p = META_PREFIX
    lengths = [len(option) for option in options]
    mean = sum(lengths) / len(lengths)
    spread = math.sqrt(sum((n - mean) ** 2 for n in lengths) / len(lengths))
    numeric = sum(1 for option in options if any(char.isdigit() for char in option))
    return [
        f"{p}om{bisect.bisect_right(MEAN_OPTION_EDGES, mean)}",
        f"{p}onum{0 if numeric == 0 else 2 if numeric == len(lengths) else 1}",
        f"{p}omin{bisect.bisect_right(OPTION_MIN_EDGES, min(lengths))}",
        f"{p}ospr{bisect.bisect_right(OPTION_SPREAD_EDGES, spread)}",
    ]


def meta_tokens(features: PromptFeatures, normalised: Normalised) -> str:
    """The structural tokens of a prompt, e.g. ``tgmktxt tgmwb3 tgmtxtstep1 …``.

    Kind (``kind_of``); the normalised stem's word bucket; a *thermometer* of the normalised
    body's length per kind (``tgm<kind>tick1`` … ``tgm<kind>tick<steps>``, ``length_steps``: a
    slope per kind on the log length, learnt, then raised by the blend's length slope,
    ``router.training.blend``); code and maths flags and script (of the clipped message, as
    ``PromptFeatures`` has them); for options their mean length, digits, shortest and spread
    (none of them the option count, which is format); the stem's capital share, numbers with
    units, numbers, sentences and question marks; and the hand features of
    ``router.prompt_text.intent_tokens``.
    """
    p = META_PREFIX
    stem, body = normalised.stem, normalised.body
    kind = kind_of(normalised, features.has_code, features.has_math)
    tokens = [f"{p}k{kind}", f"{p}wb{word_bucket(len(stem.split()))}"]
    tokens.extend(f"{p}{kind}tick{i}" for i in range(1, length_steps(len(body), kind) + 1))
    tokens.append(f"{p}code" if features.has_code else f"{p}nocode")
    tokens.append(f"{p}math" if features.has_math else f"{p}nomath")
    tokens.append(f"{p}{features.script}")
    if len(normalised.options) >= 2:
        tokens.extend(_option_tokens(normalised.options))
    tokens.append(f"{p}up{bisect.bisect_right(UPPER_SHARE_EDGES, features.upper_share)}")
    tokens.append(f"{p}qty{min(features.quantities, 3)}")
    size = features.size
    tokens.append(f"{p}nn{min(size.numbers, 8)}")
    tokens.append(f"{p}ss{min(size.sentences, 6)}")
    tokens.append(f"{p}qm{min(features.question_marks, 1)}")
    tokens.extend(intent_tokens(stem, p))
    return " ".join(tokens)


def model_text_of(text: str) -> str:
    """The model text of one user message (see ``model_text``)."""
    return model_text(PromptFeatures.from_text(text))


def model_text(features: PromptFeatures) -> str:
    """What the pipeline reads: the structural tokens, a newline, the normalised body.

    The last user message is clipped (``features.clip``), its format taken off
    (``router.prompt_text.normalise``: chat template, headers, option letters, answer
    scaffolding), and what is left is read as its stem and its options' texts.
    """
    normalised = normalise(clip(features.last_user_text))
    return f"{meta_tokens(features, normalised)}\n{normalised.body}"


class ModelMetadata:
    """What a model file records beside the model: the default threshold and the share curve."""

    __slots__ = ("_share_curve", "metadata")

    def __init__(self, metadata: dict[str, Any] | None) -> None:
        self.metadata: dict[str, Any] = dict(metadata or {})
        curve = self.metadata.get("share_thresholds")
        self._share_curve = tuple(float(v) for v in curve) if curve else None

    @property
    def threshold(self) -> float | None:
        """The default threshold chosen at training time, if the model file records one."""
        value = self.metadata.get("threshold")
        return None if value is None else float(value)

    def threshold_for_share(self, share: float) -> float:
        """The threshold at which ``share`` (0..1) of the validation mix goes large.

        Raises ``ValueError`` for a model file without a share curve (trained before
        calibration was recorded; retrain with ``tiergate train``).
        """
        if self._share_curve is None:
            raise ValueError("this model file records no share curve; retrain it")
        return threshold_for_share(self._share_curve, share)


E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class HashedExpert:
    """One expert as served: its hashed scorer (text → fitted probability) and output map."""

    scorer: HashedLinearScorer
    output: Output


class ExpertModel(ModelMetadata, Generic[E]):
    """A model's experts (one for each name in ``router.experts.EXPERTS``) and its metadata."""

    __slots__ = ("experts",)

    def __init__(self, experts: Mapping[str, E], *, metadata: dict[str, Any] | None = None) -> None:
        if (missing := missing_experts(experts)) is not None:
            raise ValueError(missing)
        super().__init__(metadata)
        self.experts = dict(experts)


class HashedLinearClassifier(ExpertModel[HashedExpert]):
    """The serving classifier: per expert the pure hashed scorer (``router.scorer``) and its
    output map, and the model's metadata, as read from the serving export
    (``router.serving_export``). Needs neither scikit-learn nor numpy."""

    __slots__ = ()

    def score(self, features: PromptFeatures) -> float:
        expert = self.experts[expert_for(features)]
        return expert.output(expert.scorer(model_text(features)))
