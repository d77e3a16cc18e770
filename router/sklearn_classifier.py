"""Fitted scikit-learn pipelines as a classifier: training, evaluation, the start-up fallback.

``SklearnClassifier`` holds one ``SklearnExpert`` per expert (``router.experts``): a fitted
``Pipeline`` (text in, ``predict_proba`` out) and its output map. Each expert scores with the
hashed scorer equivalent to its pipeline (``pipeline_scorer``, checked on probe texts at
construction) when there is one, else with the pipeline itself. A serving process normally
uses ``router.classifier.HashedLinearClassifier`` from the serving export instead.

Nothing here imports scikit-learn: the fitted objects' attributes are read as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.classifier import META_PREFIX, META_TOKEN_PATTERN, ExpertModel, model_text
from router.experts import Output, expert_for
from router.features import PromptFeatures
from router.scorer import HashedBranch, HashedLinearScorer, HashingSpec

__all__ = ["SklearnClassifier", "SklearnExpert", "pipeline_scorer"]


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


class SklearnExpert:
    """One expert's fitted pipeline and output map.

    ``probability`` is the pipeline's P(class 1) for a model text (by the verified hashed
    scorer when ``fast``); ``score`` maps it through ``output``.
    """

    __slots__ = ("_fast", "_positive_index", "output", "pipeline")

    def __init__(self, pipeline: Any, output: Output) -> None:
        classes = list(getattr(pipeline, "classes_", [0, 1]))
        if 1 not in classes:
            raise ValueError(f"pipeline has no positive class 1 (classes: {classes})")
        self.pipeline = pipeline
        self.output = output
        self._positive_index = classes.index(1)
        self._fast = self._verified_fast_path()

    def _verified_fast_path(self) -> HashedLinearScorer | None:
        fast = pipeline_scorer(self.pipeline)
        if fast is None or not hasattr(self.pipeline, "classes_"):
            return None
        reference = self.probabilities(list(_PROBES))
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

    def probability(self, text: str) -> float:
        if self._fast is not None:
            return self._fast(text)
        return self.probabilities([text])[0]

    def probabilities(self, texts: list[str]) -> list[float]:
        """The pipeline's own P(class 1) for model texts, in one call."""
        proba = self.pipeline.predict_proba(texts)
        return [float(row[self._positive_index]) for row in proba]

    def score(self, text: str) -> float:
        return self.output(self.probability(text))


class SklearnClassifier(ExpertModel[SklearnExpert]):
    """The experts' fitted pipelines as a ``Classifier``, with the model's metadata."""

    __slots__ = ()

    @property
    def fast(self) -> bool:
        """Whether every expert scores with its verified hashed scorer."""
        return all(expert.fast for expert in self.experts.values())

    def score(self, features: PromptFeatures) -> float:
        return self.experts[expert_for(features)].score(model_text(features))

    def score_features(self, features: Sequence[PromptFeatures]) -> list[float]:
        """Scores of many prompts, by each expert's pipeline in one call (training,
        evaluation)."""
        scores = [0.0] * len(features)
        for name, expert in self.experts.items():
            at = [i for i, f in enumerate(features) if expert_for(f) == name]
            if not at:
                continue
            probabilities = expert.probabilities([model_text(features[i]) for i in at])
            for i, p in zip(at, probabilities, strict=True):
                scores[i] = expert.output(p)
        return scores
