"""The classifier's arithmetic in plain Python: hashed word n-grams · weights, then the logistic.

For one text it computes what a fitted scikit-learn ``Pipeline`` of a ``FeatureUnion`` of
``HashingVectorizer(analyzer="word")`` branches into a binary linear model gives as
``predict_proba(...)[0, 1]``, without importing scikit-learn, SciPy or numpy (together about
120 MB of resident memory in a serving process). Per branch, as ``HashingVectorizer`` does:

1. ``str.lower`` when ``lowercase``; ``re.findall(token_pattern)``; stop words dropped;
2. word n-grams for ``ngram_range`` (the tokens, then each run of n joined by one space);
3. each feature's UTF-8 bytes hashed with MurmurHash3 (32-bit, seed 0, signed result) to index
   ``abs(h) % n_features``, value +1 (with ``alternate_sign``, the sign of ``h``); values summed
   per index; ``binary`` sets every index present to 1; ``l2`` divides by the row's norm;
4. the row · the branch's weights (any ``FeatureUnion`` transformer weight already folded in).

Then ``z = intercept + Σ branches`` and the score is ``1 / (1 + e^-z)``.

A *head-only* branch (the structural tokens, whose pattern only matches words starting with a
prefix) reads just the first line of the text when the prefix occurs nowhere after it: the
tokens are then the same, and a long prompt is not scanned twice.

Pure: no I/O and no shared state; built once at start-up (``router.serving_export`` or
``router.classifier.pipeline_scorer``), then called per request.
"""

from __future__ import annotations

import math
import operator
import re
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import mmh3

__all__ = ["HashedBranch", "HashedLinearScorer", "HashingSpec", "word_ngrams"]


@dataclass(frozen=True, slots=True)
class HashingSpec:
    """One ``HashingVectorizer(analyzer="word")``'s settings, as far as they change a row."""

    token_pattern: str
    lowercase: bool
    ngram_range: tuple[int, int]
    n_features: int
    binary: bool
    norm: Literal["l2"] | None
    alternate_sign: bool
    stop_words: frozenset[str] | None = None
    head_prefix: str | None = None
    """Set for a branch whose tokens all start with this prefix (see the module docstring)."""

    def __post_init__(self) -> None:
        low, high = self.ngram_range
        if not 1 <= low <= high:
            raise ValueError(f"bad ngram_range {self.ngram_range!r}")
        if self.n_features < 1:
            raise ValueError(f"bad n_features {self.n_features!r}")
        if self.norm not in (None, "l2"):
            raise ValueError(f"unsupported norm {self.norm!r}")
        if re.compile(self.token_pattern).groups > 1:
            raise ValueError("token_pattern has more than one capturing group")
        if self.head_prefix is not None and not self.head_prefix:
            raise ValueError("head_prefix is empty")


def word_ngrams(
    tokens: list[str], ngram_range: tuple[int, int], stop_words: frozenset[str] | None = None
) -> list[str]:
    """Word n-grams as scikit-learn's ``_word_ngrams`` makes them."""
    if stop_words is not None:
        tokens = [t for t in tokens if t not in stop_words]
    low, high = ngram_range
    if high == 1:
        return tokens
    grams = list(tokens) if low == 1 else []
    for n in range(max(low, 2), min(high, len(tokens)) + 1):
        # runs of n consecutive tokens, in order: the list shifted by 0 .. n-1, zipped (the
        # shorter shifts end it)
        grams.extend(map(" ".join, zip(*(tokens[i:] for i in range(n)), strict=False)))
    return grams


class HashedBranch:
    """One vectorizer and its slice of the weights: ``value(text)`` = its row · weights."""

    __slots__ = ("_findall", "spec", "weights")

    def __init__(self, spec: HashingSpec, weights: Sequence[float]) -> None:
        if len(weights) != spec.n_features:
            raise ValueError(f"{len(weights)} weights for {spec.n_features} features")
        self.spec = spec
        self.weights = array("d", weights)
        self._findall = re.compile(spec.token_pattern).findall

    def _head(self, text: str) -> str:
        head, newline, rest = text.partition("\n")
        prefix = self.spec.head_prefix
        if prefix is None or not newline or prefix in rest.lower():
            return text
        return head

    def value(self, text: str) -> float:
        spec = self.spec
        text = self._head(text)
        if spec.lowercase:
            text = text.lower()
        tokens = word_ngrams(self._findall(text), spec.ngram_range, spec.stop_words)
        if not tokens:
            return 0.0
        n = spec.n_features
        hashes = _hashes(text, tokens)
        if spec.alternate_sign or spec.binary:
            return self._value_of_counts(hashes)
        # Every value is a count: Σ over tokens of w[index] is the row · weights, and the
        # norm needs only how often each index occurs.
        indices = [abs(h) % n for h in hashes]
        total = sum(map(self.weights.__getitem__, indices))
        if spec.norm is None:
            return total
        counts = Counter(indices).values()
        return total / math.sqrt(sum(map(operator.mul, counts, counts)))

    def _value_of_counts(self, hashes: list[int]) -> float:
        """The general case: signed counts per index, or 1 per index present (``binary``)."""
        spec, weights, n = self.spec, self.weights, self.spec.n_features
        counts: Counter[int] = Counter()
        if spec.alternate_sign:
            for h in hashes:
                counts[abs(h) % n] += 1 if h >= 0 else -1
        else:
            counts.update(abs(h) % n for h in hashes)
        if spec.binary:  # scikit-learn sets every stored entry to 1, even a sum of 0
            total = sum(map(weights.__getitem__, counts))
            squares = float(len(counts))
        else:
            total = sum(weights[i] * v for i, v in counts.items())
            squares = float(sum(v * v for v in counts.values()))
        if spec.norm == "l2":
            norm = math.sqrt(squares)
            return total / norm if norm else 0.0
        return total


def _hashes(text: str, tokens: list[str]) -> list[int]:
    """MurmurHash3 (32-bit, seed 0, signed) of each token's UTF-8 bytes, as scikit-learn does.

    mmh3 encodes a ``str`` itself, but crashes the interpreter on one that UTF-8 cannot encode
    (a lone surrogate). Tokens of a text that encodes are safe; those of any other text are
    encoded here first, which raises ``UnicodeEncodeError`` as scikit-learn does.
    """
    if text.isascii() or _encodes(text):
        return list(map(mmh3.hash, tokens))
    return [mmh3.hash(token.encode("utf-8")) for token in tokens]


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class HashedLinearScorer:
    """``text`` → P(class 1) of the pipeline it was made from: logistic(intercept + Σ branches)."""

    __slots__ = ("branches", "intercept")

    def __init__(self, branches: Sequence[HashedBranch], intercept: float) -> None:
        if not branches:
            raise ValueError("a scorer needs at least one branch")
        if not math.isfinite(intercept):
            raise ValueError(f"intercept {intercept!r} is not finite")
        self.branches = tuple(branches)
        self.intercept = float(intercept)

    def __call__(self, text: str) -> float:
        z = self.intercept
        for branch in self.branches:
            z += branch.value(text)
        if z >= 0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)
