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
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from router.features import PromptFeatures, clip
from router.scorer import HashedBranch, HashedLinearScorer, HashingSpec

__all__ = [
    "META_PREFIX",
    "META_TOKEN_PATTERN",
    "MODEL_TEXT_VERSION",
    "CalibratedClassifier",
    "Classifier",
    "HashedLinearClassifier",
    "SklearnClassifier",
    "model_text",
    "pipeline_scorer",
    "threshold_for_share",
]

MODEL_TEXT_VERSION = 3
META_PREFIX = "tgm"
"""Structural tokens start with this; the word vectorizer skips them, the meta one keeps them."""
META_TOKEN_PATTERN = rf"\b{META_PREFIX}\w+\b"
"""The meta vectorizer's token pattern: only structural tokens match it."""


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


def _word_bucket(words: int) -> int:
    """0 for fewer than 4 words, then one bucket per half doubling (4, 6, 8, 12, 16, 23, …)."""
    if words < 4:
        return 0
    return min(16, int(2 * math.log2(words)) - 3)


def size_tokens(features: PromptFeatures) -> list[str]:
    """How much a question asks (version 3): numbers written with digits (0 … 12 or more),
    words (half-doubling buckets) and sentences (0 … 10 or more) in the question stem.

    A maths word problem's solution grows with the quantities and facts it gives; these
    follow GSM8K's solution step counts about as well as prompt length and together much
    better (docs/classifier.md).
    """
    p = META_PREFIX
    return [
        f"{p}nn{min(features.numbers, 12)}",
        f"{p}wc{_word_bucket(features.stem_words)}",
        f"{p}ss{min(features.sentences, 10)}",
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
    tokens.extend(size_tokens(features))
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


def _hashing_spec(vectorizer: Any) -> HashingSpec | None:
    """The settings of a word ``HashingVectorizer`` the hashed scorer reproduces exactly, or
    ``None`` for anything else (other analyzers, custom callables, accent stripping…)."""
    if type(vectorizer).__name__ != "HashingVectorizer":
        return None
    plain = (
        vectorizer.analyzer == "word"
        and vectorizer.input == "content"
        and vectorizer.preprocessor is None
        and vectorizer.tokenizer is None
        and vectorizer.strip_accents is None
        and isinstance(vectorizer.token_pattern, str)
        and vectorizer.norm in (None, "l2")
        and getattr(vectorizer.dtype, "__name__", None) == "float64"
    )
    if not plain:
        return None
    low, high = vectorizer.ngram_range
    stop_words = vectorizer.get_stop_words()
    return HashingSpec(
        token_pattern=vectorizer.token_pattern,
        lowercase=bool(vectorizer.lowercase),
        ngram_range=(int(low), int(high)),
        n_features=int(vectorizer.n_features),
        binary=bool(vectorizer.binary),
        norm=vectorizer.norm,
        alternate_sign=bool(vectorizer.alternate_sign),
        stop_words=None if stop_words is None else frozenset(stop_words),
        head_prefix=META_PREFIX if vectorizer.token_pattern == META_TOKEN_PATTERN else None,
    )


def pipeline_scorer(pipeline: Any) -> HashedLinearScorer | None:
    """The hashed scorer equivalent to a fitted pipeline, or ``None`` if it has another shape.

    Supported: ``Pipeline([(_, FeatureUnion([(name, HashingVectorizer(analyzer="word")), …])),
    (_, <binary linear model>)])`` with plain vectorizers (``_hashing_spec``); transformer
    weights are folded into the weights. Reads the fitted objects' attributes only, so it
    imports nothing from scikit-learn. Callers check it against the pipeline on probe texts.
    """
    try:
        (_, union), (_, model) = pipeline.steps
        if len(model.coef_) != 1 or list(model.classes_) != [0, 1]:
            return None
        coef = [float(w) for w in model.coef_[0].tolist()]
        scale = union.transformer_weights or {}
        branches: list[HashedBranch] = []
        offset = 0
        for name, vectorizer in union.transformer_list:
            spec = _hashing_spec(vectorizer)
            if spec is None:
                return None
            factor = float(scale.get(name, 1.0))
            weights = coef[offset : offset + spec.n_features]
            branches.append(HashedBranch(spec, [w * factor for w in weights]))
            offset += spec.n_features
        if offset != len(coef):
            return None
        return HashedLinearScorer(branches, float(model.intercept_[0]))
    except (AttributeError, TypeError, ValueError, IndexError):
        return None


class _ModelMetadata:
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


class HashedLinearClassifier(_ModelMetadata):
    """The serving classifier: the pure hashed scorer (``router.scorer``) and the model's
    metadata, as read from the serving export (``router.serving_export``). Needs neither
    scikit-learn nor numpy."""

    __slots__ = ("scorer",)

    def __init__(
        self, scorer: HashedLinearScorer, *, metadata: dict[str, Any] | None = None
    ) -> None:
        super().__init__(metadata)
        self.scorer = scorer

    def score(self, features: PromptFeatures) -> float:
        return self.scorer(model_text(features))


class SklearnClassifier(_ModelMetadata):
    """A fitted scikit-learn pipeline (text in, ``predict_proba`` out) as a ``Classifier``.

    Scoring uses the hashed scorer equivalent to the pipeline (``pipeline_scorer``, checked on
    probe texts at construction); ``fast`` says whether it is in use, else the pipeline itself
    is called. Training, evaluation and the start-up fallback use it; serving normally uses
    ``HashedLinearClassifier`` from the serving export instead.
    """

    __slots__ = ("_fast", "_positive_index", "pipeline")

    def __init__(self, pipeline: Any, *, metadata: dict[str, Any] | None = None) -> None:
        classes = list(getattr(pipeline, "classes_", [0, 1]))
        if 1 not in classes:
            raise ValueError(f"pipeline has no positive class 1 (classes: {classes})")
        super().__init__(metadata)
        self.pipeline = pipeline
        self._positive_index = classes.index(1)
        self._fast = self._verified_fast_path()

    def _verified_fast_path(self) -> HashedLinearScorer | None:
        fast = pipeline_scorer(self.pipeline)
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
    def scorer(self) -> HashedLinearScorer | None:
        """The verified hashed scorer (what the serving export is written from), if any."""
        return self._fast

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
