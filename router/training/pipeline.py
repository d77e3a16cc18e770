"""The scikit-learn pipeline each expert is made of, built from stock parts only.

Two hashing vectorizers over the model text (see ``router.classifier.model_text``): word 1-2-grams
of the prompt (L2-normalised; the structural tokens are excluded by the token pattern), and the
structural tokens as binary indicators at full strength whatever the prompt length. No
vocabulary is stored, so the file size is set by ``word_features`` alone. Then a logistic
regression (L2, lbfgs, deterministic). ``words=False`` leaves the word branch out: the
multiple-choice expert reads the structural tokens only (``OPEN_PIPELINE``,
``MULTIPLE_CHOICE_PIPELINE``).

Character n-grams were tried and left out: they added nothing measurable on validation
(AUC within ±0.003) and tripled scoring time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import FeatureUnion, Pipeline

from router.classifier import META_PREFIX, META_TOKEN_PATTERN

__all__ = ["MULTIPLE_CHOICE_PIPELINE", "OPEN_PIPELINE", "PipelineConfig", "build_pipeline"]


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    word_features: int = 2**16
    word_ngrams: tuple[int, int] = (1, 1)
    meta_features: int = 2**14
    stop_words: str | None = None
    """``"english"`` drops scikit-learn's stop words; tried, no better on validation."""
    c: float = 1.0
    """Inverse L2 regularisation strength of the logistic regression."""
    max_iter: int = 3000
    words: bool = True
    """Whether the word branch is there; without it the model reads the structural tokens."""


OPEN_PIPELINE = PipelineConfig()
MULTIPLE_CHOICE_PIPELINE = PipelineConfig(words=False, c=0.03)
"""Structural and shape tokens only, strongly regularised. On MMLU-Pro's outcomes (grouped CV
of the training split, docs/classifier.md, round 4) the words only fitted noise: APGR 0.564 so,
0.560 tokens only at C = 1, 0.547 with the words at C = 1."""


def build_pipeline(config: PipelineConfig) -> Any:
    """An unfitted pipeline: model text → P(large needed)."""
    words = HashingVectorizer(
        analyzer="word",
        ngram_range=config.word_ngrams,
        n_features=config.word_features,
        alternate_sign=False,
        token_pattern=rf"(?u)\b(?!{META_PREFIX})\w\w+\b",
        stop_words=config.stop_words,
    )
    meta = HashingVectorizer(
        analyzer="word",
        n_features=config.meta_features,
        alternate_sign=False,
        binary=True,
        norm=None,
        token_pattern=META_TOKEN_PATTERN,
    )
    branches = [("words", words), ("meta", meta)] if config.words else [("meta", meta)]
    features = FeatureUnion(branches)
    model = LogisticRegression(C=config.c, max_iter=config.max_iter)
    return Pipeline([("features", features), ("model", model)])
