"""Complexity classifiers: one score in [0, 1], higher when the large model is more needed.

A model is two experts (``router.experts``: multiple-choice questions, everything else), each a
scikit-learn ``Pipeline`` that takes *model text*: the last user message (clipped) behind a
line of structural tokens (length bucket, code, maths, options, script; since version 2 the
question's shape, ``shape_tokens``; since version 3 its size, ``size_tokens``). Putting the
structural features into the text keeps the pipelines made of stock scikit-learn parts only, so
the model file needs no custom code to load. ``model_text`` is the one place that text is
built, for training and for scoring alike; changing it changes what a model file means, so bump
``MODEL_TEXT_VERSION`` when you do.

``HashedLinearClassifier`` (here) serves the experts from the serving export without
scikit-learn; ``router.sklearn_classifier.SklearnClassifier`` wraps the fitted pipelines for
training, evaluation and the start-up fallback.

Calibration: scores are a ranking, not probabilities. A model file records its **share curve**
(``share_thresholds``): for each target share of traffic to the large tier, 0 %, 1 %, …, 100 %,
the score threshold at which that share of the validation mix (equal weight to everyday
instructions, arena-hard, MMLU-Pro and GSM8K prompts) scores at or above it.
``threshold_for_share`` interpolates it; a tenant's ``large_share: 0.3`` becomes
``classifier.threshold_for_share(0.3)``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from router.experts import Output, expert_for, missing_experts
from router.features import PromptFeatures, StemSize, clip
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
    "model_text",
    "threshold_for_share",
]

MODEL_TEXT_VERSION = 3
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


def _length_bucket(chars: int) -> int:
    """0 for < 32 characters, then one bucket per doubling, capped at 10 (≥ 16k characters)."""
    if chars < 32:
        return 0
    return min(10, int(math.log2(chars)) - 4)


UPPER_SHARE_EDGES = (0.009, 0.012, 0.015, 0.018, 0.023, 0.031, 0.045)
OPTION_MIN_EDGES = (4, 6, 10, 16, 25, 40, 59)
OPTION_SPREAD_EDGES = (0.3, 0.5, 1.25, 3.4, 6.8, 12.0, 20.0)
"""Bucket edges of the question-shape tokens: the octiles of the MMLU-Pro training questions
(capital-letter share of the stem; shortest option; standard deviation of option lengths)."""


def _option_spread(lengths: Sequence[int]) -> float:
    mean = sum(lengths) / len(lengths)
    return math.sqrt(sum((n - mean) ** 2 for n in lengths) / len(lengths))


def shape_tokens(features: PromptFeatures) -> list[str]:
    """Question-shape tokens (version 2): what the MMLU-Pro outcomes were found to follow.

    Capital-letter share of the stem, shortest option and spread of option lengths (octile
    buckets), options with digits (none / some / all), numbers with units, formula characters
    and question marks in the stem (small counts).
    """
    p = META_PREFIX
    tokens = [f"{p}up{bisect.bisect_right(UPPER_SHARE_EDGES, features.upper_share)}"]
    lengths = features.option_lengths
    if lengths:
        tokens.append(f"{p}omin{bisect.bisect_right(OPTION_MIN_EDGES, min(lengths))}")
        tokens.append(f"{p}ospr{bisect.bisect_right(OPTION_SPREAD_EDGES, _option_spread(lengths))}")
        numeric = features.numeric_options
        tokens.append(f"{p}onum{0 if numeric == 0 else 2 if numeric == len(lengths) else 1}")
    else:
        tokens.append(f"{p}noopts")
    tokens.append(f"{p}qty{min(features.quantities, 3)}")
    tokens.append(f"{p}fx{min(features.formula_chars, 2)}")
    tokens.append(f"{p}qm{min(features.question_marks, 1)}")
    return tokens


def _word_bucket(words: int) -> int:
    """0 for fewer than 4 words, then one bucket per half doubling (4, 6, 8, 12, 16, 23, …)."""
    if words < 4:
        return 0
    return min(16, int(2 * math.log2(words)) - 3)


def size_tokens(size: StemSize) -> list[str]:
    """How much a question asks (version 3): numbers written with digits (0 … 12 or more),
    words (half-doubling buckets) and sentences (0 … 10 or more) in the question stem.

    A maths word problem's solution grows with the quantities and facts it gives: with these
    the open expert follows GSM8K's solution step counts far better than prompt length does
    (docs/classifier.md, round 4). A multiple-choice question's text has none (its features
    carry no ``size``): there they cost the multiple-choice expert's ranking a little, and its
    size is told by the shape tokens.
    """
    p = META_PREFIX
    return [
        f"{p}nn{min(size.numbers, 12)}",
        f"{p}wc{_word_bucket(size.words)}",
        f"{p}ss{min(size.sentences, 10)}",
    ]


def meta_tokens(features: PromptFeatures) -> str:
    """The structural features as words, e.g. ``tgmlen3 tgmcode tgmopts4 tgmlatin tgmup2 …``."""
    p = META_PREFIX
    tokens = [f"{p}len{_length_bucket(features.chars)}"]
    tokens.append(f"{p}code" if features.has_code else f"{p}nocode")
    tokens.append(f"{p}math" if features.has_math else f"{p}nomath")
    tokens.append(f"{p}opts{min(features.n_options, 10)}")
    tokens.append(f"{p}{features.script}")
    tokens.extend(shape_tokens(features))
    if features.size is not None:
        tokens.extend(size_tokens(features.size))
    return " ".join(tokens)


def model_text(features: PromptFeatures) -> str:
    """What the pipeline reads: the structural tokens, a newline, the clipped last user text.

    The length bucket still sees the full length; the text is ``features.clip``-ped.
    """
    return f"{meta_tokens(features)}\n{clip(features.last_user_text)}"


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
