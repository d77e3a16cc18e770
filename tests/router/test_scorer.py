"""The pure hashed scorer against scikit-learn's own HashingVectorizer and murmurhash3."""

from __future__ import annotations

import random
from typing import Any

import mmh3
import numpy as np
import pytest
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.utils import murmurhash3_32

from router.classifier import META_PREFIX, META_TOKEN_PATTERN
from router.scorer import HashedBranch, HashedLinearScorer, HashingSpec, word_ngrams

TEXTS = [
    "",
    "   ",
    "The quick brown fox jumps over the lazy dog, and the dog sleeps.",
    "UPPER lower MiXeD the the the THE",
    "请证明:对于所有正整数 n, n^3 - n 能被 6 整除。",
    "Объясните, как работает сборщик мусора в Java.",
    "ما هي عاصمة فرنسا؟ éàü ß İstanbul",
    "🙂🔥💯 emoji 🙂 words",
    "def f(a, b):\n    return a == b  # tgmcode tgmlen3\n",
    "tgmlen3 tgmcode TGMmath tgmopts4\nsecond line tgmup2 and more tgmlen3",
    "first line only\nno structural tokens here",
    "x" * 3000 + " y" * 500,
]
PATTERNS = [r"(?u)\b\w\w+\b", r"(?u)\b(?!tgm)\w\w+\b", META_TOKEN_PATTERN, r"\S+"]


def _junk(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n)).decode("latin-1")


def _reference(vectorizer: HashingVectorizer, weights: np.ndarray, text: str) -> float:
    row = vectorizer.transform([text])
    return float((row @ weights)[0])


SETTINGS: list[dict[str, Any]] = [
    {"ngram_range": (1, 2), "norm": "l2", "alternate_sign": False, "binary": False},
    {"ngram_range": (1, 1), "norm": None, "alternate_sign": False, "binary": True},
    {"ngram_range": (1, 3), "norm": "l2", "alternate_sign": True, "binary": False},
    {"ngram_range": (2, 3), "norm": None, "alternate_sign": True, "binary": False},
    {"ngram_range": (1, 2), "norm": "l2", "alternate_sign": True, "binary": True},
    {"ngram_range": (1, 2), "norm": "l2", "alternate_sign": False, "lowercase": False},
    {"ngram_range": (1, 2), "norm": "l2", "alternate_sign": False, "stop_words": "english"},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_branch_is_the_vectorizer_row_dot_the_weights(
    settings: dict[str, Any], pattern: str
) -> None:
    n_features = 2**9 + 7  # not a power of two: abs(h) % n must be exactly scikit-learn's
    vectorizer = HashingVectorizer(n_features=n_features, token_pattern=pattern, **settings)
    weights = np.random.default_rng(3).normal(size=n_features)
    stop_words = vectorizer.get_stop_words()
    spec = HashingSpec(
        token_pattern=pattern,
        lowercase=settings.get("lowercase", True),
        ngram_range=settings["ngram_range"],
        n_features=n_features,
        binary=settings.get("binary", False),
        norm=settings["norm"],
        alternate_sign=settings["alternate_sign"],
        stop_words=None if stop_words is None else frozenset(stop_words),
    )
    branch = HashedBranch(spec, weights.tolist())
    for text in [*TEXTS, _junk(2000, 1), _junk(300, 2)]:
        assert branch.value(text) == pytest.approx(_reference(vectorizer, weights, text), abs=1e-12)


@pytest.mark.parametrize("ngram_range", [(1, 1), (1, 2), (1, 3), (2, 2), (2, 4), (3, 3)])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 5])
def test_word_ngrams_are_scikit_learns(ngram_range: tuple[int, int], count: int) -> None:
    tokens = [f"t{i}" for i in range(count)]
    vectorizer = HashingVectorizer(ngram_range=ngram_range)
    assert word_ngrams(tokens, ngram_range) == vectorizer._word_ngrams(tokens)


def test_mmh3_hashes_utf8_as_scikit_learn_does() -> None:
    rng = random.Random(11)
    alphabet = "abcXYZ 0123 éßñİ中文日本語한국어Ωж🙂\x00\t\n"
    for _ in range(5000):
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        expected = murmurhash3_32(token, seed=0)
        assert mmh3.hash(token.encode("utf-8")) == expected, token
        assert mmh3.hash(token) == expected, token  # a str that encodes: hashed as UTF-8


def test_head_only_branch_reads_the_whole_text_when_the_prefix_recurs() -> None:
    weights = [0.0] * 64
    spec = HashingSpec(
        token_pattern=META_TOKEN_PATTERN,
        lowercase=True,
        ngram_range=(1, 1),
        n_features=64,
        binary=True,
        norm=None,
        alternate_sign=False,
        head_prefix=META_PREFIX,
    )
    later = "tgmlate"
    weights[abs(mmh3.hash(later.encode())) % 64] = 1.0
    branch = HashedBranch(spec, weights)
    assert branch.value("tgmfirst\nsome words") == 0.0
    assert branch.value(f"tgmfirst\nsome words {later.upper()}") == 1.0


def test_a_lone_surrogate_in_a_token_raises_instead_of_crashing() -> None:
    spec = HashingSpec(r"\S+", True, (1, 1), 16, False, None, False)
    branch = HashedBranch(spec, [0.5] * 16)
    with pytest.raises(UnicodeEncodeError):
        branch.value("abc\ud800def")
    vectorizer = HashingVectorizer(n_features=16, token_pattern=r"\S+")
    with pytest.raises(UnicodeEncodeError):
        vectorizer.transform(["abc\ud800def"])


def test_the_scorer_is_the_logistic_of_intercept_plus_branches() -> None:
    spec = HashingSpec(r"\w+", True, (1, 1), 8, True, None, False)
    scorer = HashedLinearScorer([HashedBranch(spec, [2.0] * 8)], intercept=-1.0)
    assert scorer("") == pytest.approx(1 / (1 + np.exp(1.0)), abs=1e-15)
    assert scorer("a") == pytest.approx(1 / (1 + np.exp(-1.0)), abs=1e-15)
    big = HashedLinearScorer([HashedBranch(spec, [800.0] * 8)], intercept=0.0)
    assert big("a") == 1.0
    tiny = HashedLinearScorer([HashedBranch(spec, [-800.0] * 8)], intercept=0.0)
    assert tiny("a") == 0.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ngram_range": (2, 1)}, "ngram_range"),
        ({"n_features": 0}, "n_features"),
        ({"norm": "l1"}, "norm"),
        ({"token_pattern": r"(a)(b)"}, "capturing group"),
        ({"head_prefix": ""}, "head_prefix"),
    ],
)
def test_bad_specs_are_refused(changes: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {
        "token_pattern": r"\w+",
        "lowercase": True,
        "ngram_range": (1, 1),
        "n_features": 8,
        "binary": False,
        "norm": None,
        "alternate_sign": False,
        **changes,
    }
    with pytest.raises(ValueError, match=message):
        HashingSpec(**settings)


def test_weights_must_match_the_feature_count() -> None:
    spec = HashingSpec(r"\w+", True, (1, 1), 8, False, None, False)
    with pytest.raises(ValueError, match="7 weights for 8 features"):
        HashedBranch(spec, [0.0] * 7)
