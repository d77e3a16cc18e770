"""Complexity classifiers: one score in [0, 1], the probability that the large model is needed.

``SklearnClassifier`` wraps a scikit-learn ``Pipeline`` that takes *model text*: the last user
message (clipped) behind a line of structural tokens (length bucket, code, maths, options,
script; since version 2 also the question's shape, ``shape_tokens``). Putting the structural
features into the text keeps the pipeline made of stock scikit-learn parts only, so the model
file needs no custom code to load. ``model_text`` is the one place that text is built, for
training and for scoring alike; changing it changes what a model file means, so bump
``MODEL_TEXT_VERSION`` when you do.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from sklearn.utils import murmurhash3_32

from router.features import PromptFeatures, clip

__all__ = [
    "META_PREFIX",
    "MODEL_TEXT_VERSION",
    "CalibratedClassifier",
    "Classifier",
    "SklearnClassifier",
    "model_text",
    "threshold_for_share",
]

MODEL_TEXT_VERSION = 2
META_PREFIX = "tgm"
"""Structural tokens start with this; the word vectorizer skips them, the meta one keeps them."""


@runtime_checkable
class Classifier(Protocol):
    """Scores a prompt: P(the large model is needed), in [0, 1]."""

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


def meta_tokens(features: PromptFeatures) -> str:
    """The structural features as words, e.g. ``tgmlen3 tgmcode tgmopts4 tgmlatin tgmup2 …``."""
    p = META_PREFIX
    tokens = [f"{p}len{_length_bucket(features.chars)}"]
    tokens.append(f"{p}code" if features.has_code else f"{p}nocode")
    tokens.append(f"{p}math" if features.has_math else f"{p}nomath")
    tokens.append(f"{p}opts{min(features.n_options, 10)}")
    tokens.append(f"{p}{features.script}")
    tokens.extend(shape_tokens(features))
    return " ".join(tokens)


def model_text(features: PromptFeatures) -> str:
    """What the pipeline reads: the structural tokens, a newline, the clipped last user text.

    The length bucket still sees the full length; the text is ``features.clip``-ped.
    """
    return f"{meta_tokens(features)}\n{clip(features.last_user_text)}"


_PROBES = (
    "",
    "tgmlen0 tgmnocode tgmnomath tgmopts0 tgmlatin\nWhat is the capital of France?",
    "tgmlen3 tgmcode tgmmath tgmopts4 tgmcjk\n证明 x^2 ≥ 0; def f(a, b): return a == b\nA. 1\nB. 2",
)
"""Texts on which the fast scorer must agree with the pipeline before it is used."""


_META_PATTERN = rf"\b{META_PREFIX}\w+\b"


@dataclass(frozen=True, slots=True)
class _Branch:
    analyzer: Callable[[str], list[str]]
    n_features: int
    binary: bool
    l2: bool
    alternate_sign: bool
    weights: np.ndarray
    meta_only: bool
    """Its tokens are the structural ones: it reads only the first line of the model text
    unless the prefix also occurs further on (then all of it, as the pipeline does)."""


class _HashedLinearScorer:
    """The pipeline's arithmetic without scikit-learn's per-call overhead.

    ``predict_proba`` on one short text costs about 1.5 ms, nearly all of it input validation
    and sparse-matrix construction; hashing the analyzers' tokens directly (murmurhash3 with
    seed 0, as ``HashingVectorizer`` does) and taking the dot product costs about a tenth of
    that. Built only for a ``FeatureUnion`` of ``HashingVectorizer`` branches feeding a binary
    linear model, and only used after agreeing with the pipeline on probe texts.
    """

    __slots__ = ("_branches", "_intercept")

    def __init__(self, branches: list[_Branch], intercept: float) -> None:
        self._branches = branches
        self._intercept = intercept

    @classmethod
    def from_pipeline(cls, pipeline: Any) -> _HashedLinearScorer | None:
        try:
            (_, union), (_, model) = pipeline.steps
            coef = np.asarray(model.coef_, dtype=np.float64)
            if coef.shape[0] != 1 or list(model.classes_) != [0, 1]:
                return None
            scale = union.transformer_weights or {}
            branches: list[_Branch] = []
            offset = 0
            for name, vectorizer in union.transformer_list:
                if type(vectorizer).__name__ != "HashingVectorizer" or vectorizer.norm not in (
                    None,
                    "l2",
                ):
                    return None
                n = int(vectorizer.n_features)
                weights = coef[0, offset : offset + n] * float(scale.get(name, 1.0))
                branches.append(
                    _Branch(
                        analyzer=vectorizer.build_analyzer(),
                        n_features=n,
                        binary=bool(vectorizer.binary),
                        l2=vectorizer.norm == "l2",
                        alternate_sign=bool(vectorizer.alternate_sign),
                        weights=weights,
                        meta_only=vectorizer.token_pattern == _META_PATTERN
                        and vectorizer.preprocessor is None
                        and vectorizer.strip_accents is None,
                    )
                )
                offset += n
            if offset != coef.shape[1]:
                return None
            return cls(branches, float(model.intercept_[0]))
        except (AttributeError, TypeError, ValueError):
            return None

    def __call__(self, text: str) -> float:
        z = self._intercept
        for branch in self._branches:
            z += _branch_value(branch, text)
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _meta_line(text: str) -> str:
    """The first line of ``text`` when the structural prefix occurs nowhere after it."""
    head, newline, rest = text.partition("\n")
    return head if newline and META_PREFIX not in rest.lower() else text


def _branch_value(branch: _Branch, text: str) -> float:
    """One vectorizer's row (as ``HashingVectorizer.transform`` makes it) · its weights."""
    tokens = branch.analyzer(_meta_line(text) if branch.meta_only else text)
    if not tokens:
        return 0.0
    hashes = np.fromiter((murmurhash3_32(t, seed=0) for t in tokens), np.int64, len(tokens))
    index, inverse = np.unique(np.abs(hashes) % branch.n_features, return_inverse=True)
    if branch.binary:
        values: np.ndarray = np.ones(len(index))
    else:
        signs = np.where(hashes < 0, -1.0, 1.0) if branch.alternate_sign else None
        values = np.bincount(inverse, weights=signs).astype(np.float64, copy=False)
    total = float(branch.weights[index] @ values)
    if branch.l2:
        norm = math.sqrt(float(values @ values))
        return total / norm if norm else 0.0
    return total


class SklearnClassifier:
    """A fitted scikit-learn pipeline (text in, ``predict_proba`` out) as a ``Classifier``.

    Scoring uses a fast path equivalent to the pipeline (checked on probe texts at
    construction); ``fast`` says whether it is in use, else the pipeline itself is called.
    """

    __slots__ = ("_fast", "_positive_index", "_share_curve", "metadata", "pipeline")

    def __init__(self, pipeline: Any, *, metadata: dict[str, Any] | None = None) -> None:
        classes = list(getattr(pipeline, "classes_", [0, 1]))
        if 1 not in classes:
            raise ValueError(f"pipeline has no positive class 1 (classes: {classes})")
        self.pipeline = pipeline
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._positive_index = classes.index(1)
        self._fast = self._verified_fast_path()
        curve = self.metadata.get("share_thresholds")
        self._share_curve = tuple(float(v) for v in curve) if curve else None

    def _verified_fast_path(self) -> _HashedLinearScorer | None:
        fast = _HashedLinearScorer.from_pipeline(self.pipeline)
        if fast is None or not hasattr(self.pipeline, "classes_"):
            return None
        reference = self._pipeline_scores(list(_PROBES))
        if all(abs(fast(t) - r) < 1e-9 for t, r in zip(_PROBES, reference, strict=True)):
            return fast
        return None

    @property
    def fast(self) -> bool:
        return self._fast is not None

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

    def score(self, features: PromptFeatures) -> float:
        text = model_text(features)
        if self._fast is not None:
            return self._fast(text)
        return self._pipeline_scores([text])[0]

    def score_texts(self, texts: list[str]) -> list[float]:
        """Scores for ready-made model texts, in one pipeline call (training, evaluation)."""
        return self._pipeline_scores(texts)

    def _pipeline_scores(self, texts: list[str]) -> list[float]:
        proba = self.pipeline.predict_proba(texts)
        return [float(row[self._positive_index]) for row in proba]
