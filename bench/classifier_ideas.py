"""Round 3 of classifier ideas, on grouped CV of the training split only (docs/classifier.md).

**A record of round 3, run at commit 39d41f7 (model text version 2, one model, the v2 labels).**
Later code changed what it imports: model text version 3, the experts' labels in
``router/training/labels.py``. Rerun at a later commit it trains on those and its figures
differ from ``bench/results/classifier_ideas.json``; check out 39d41f7 to reproduce them.

Same protocol as ``bench/classifier_cv.py`` with one addition: the everyday and arena-hard
training rows are cut into the same grouped folds as the MMLU-Pro rows, so every idea also gets
an out-of-fold everyday-vs-arena-hard ROC AUC (the chat separation the shipped model must keep).
Each fold is scored by models fitted on the other four folds plus every GSM8K training row; the
validation split is never read. Two group shuffles of 5 folds; a figure is the mean of the ten
fold values, ``se`` the standard error of a fold mean (standard deviation of the five folds of a
shuffle / √5, averaged over the two shuffles), and ``minus_v2`` the paired per-fold difference
from the shipped pipeline in the same folds, with its standard error computed the same way.

Ideas (none of them in the "What was tried" table):

* ``difficulty_hump_8b``: the gain strong - weak peaks at middling difficulty (easy questions are
  answered by both models, hard ones by neither). A logistic regression on the v2 features
  (hashed words + structural and shape tokens), MMLU-Pro rows only, predicts P(8B correct); on
  the training folds a quadratic in its logit is fitted by least squares to the gain, using
  *inner* out-of-fold predictions (3 inner grouped folds); the score is that quadratic.
* ``difficulty_hump_mean``: the same with the difficulty predicted from both outcomes (soft
  label (8B correct + 70B correct) / 2: two draws per question instead of one).
* ``v2_plus_hump``: the shipped pipeline's logit plus the hump score, each standardised on the
  training folds' MMLU-Pro rows, equal weights (fixed in advance, not tuned).
* ``multitask_70b_minus_8b``: P(70B correct) - P(8B correct) from two logistic regressions on the
  v2 features, MMLU-Pro rows only, both-wrong rows kept.
* ``v2_plus_multitask``: the shipped logit plus that difference, standardised, equal weights.
* ``pairwise_mmlu``: a pairwise (RankNet-style) logistic regression without intercept on
  differences of v2 feature vectors, for sampled MMLU-Pro pairs with different gain (the one
  with the larger gain labelled 1, both orders): the objective APGR ranks by.
* ``pairwise_mmlu_weak``: the same plus the weak labels as pairs: arena-hard (not creative) above
  everyday, and GSM8K problems with more solution steps above fewer (fixed pair counts).
* ``knn_gain``: mean gain of the 50 most similar training questions (cosine of the hashed word
  vectors): whether neighbouring questions share their gain beyond what a linear model sees.

``decision`` applies the rule fixed before the run (APGR at least +0.015 above v2 and the chat AUC
within 0.01 of v2's). ``stability`` repeats v2 and the multitask difference, the best APGR of the
first run, on three further group shuffles: added after seeing that run, a check and no selection.

    OPENBLAS_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/classifier_ideas.py   # ~5 minutes
    # writes bench/results/classifier_ideas.json
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold

from router.classifier import model_text
from router.features import PromptFeatures
from router.training.apgr import cost_quality_curve
from router.training.data import Row, group_key, load_rows
from router.training.evaluate import split_rows
from router.training.labels import ARENA_HARD_SOURCES, EVERYDAY_SOURCES, LabelScheme, targets
from router.training.pipeline import PipelineConfig, build_pipeline
from router.training.train import _examples

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "classifier_ideas.json"
FOLDS = 5
INNER_FOLDS = 3
SHUFFLES = (0, 1)
EXTRA_SHUFFLES = (2, 3, 4)
"""Only for the stability check of the best idea against v2 (``stability``), after the fact."""
SEED = 0
MMLU_PAIRS = 16_000
CHAT_PAIRS = 4_000
GSM8K_PAIRS = 2_000
NEIGHBOURS = 50
WORD_FEATURES = PipelineConfig().word_features


class Data:
    """The training split: MMLU-Pro rows first, then everyday and arena-hard, then GSM8K."""

    def __init__(self) -> None:
        rows = load_rows(REPO / "data" / "routing")
        train, _ = split_rows(rows, seed=0, fraction=0.2)
        mmlu = [r for r in train if r.source == "mmlu_pro"]
        contrast = [r for r in train if r.source in EVERYDAY_SOURCES | ARENA_HARD_SOURCES]
        rest = [r for r in train if r.source == "gsm8k_train"]
        self.rows: list[Row] = mmlu + contrast + rest
        self.n_mmlu = len(mmlu)
        self.n_scored = len(mmlu) + len(contrast)
        self.weak = np.array([float(bool(r.weak_correct)) for r in mmlu])
        self.strong = np.array([float(bool(r.strong_correct)) for r in mmlu])
        self.gain = self.strong - self.weak
        self.arena = np.array([r.source in ARENA_HARD_SOURCES for r in self.rows])
        self.everyday = np.array([r.source in EVERYDAY_SOURCES for r in self.rows])
        self.creative = np.array([r.category == "creative_writing" for r in self.rows])
        self.steps = np.array([r.solution_steps or 0 for r in self.rows])
        self.lengths = np.array([len(r.prompt) for r in self.rows], dtype=np.float64)
        keys = [group_key(r.prompt) for r in self.rows]
        _, self.groups = np.unique(keys, return_inverse=True)
        pipeline = build_pipeline(PipelineConfig())
        texts = [model_text(PromptFeatures.from_text(r.prompt)) for r in self.rows]
        self.x: sp.csr_matrix = pipeline.named_steps["features"].fit_transform(texts).tocsr()
        self.words: sp.csr_matrix = self.x[:, :WORD_FEATURES].tocsr()

    def folds(self, shuffle: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(train, test) row indices; test holds MMLU-Pro and everyday/arena-hard rows only."""
        groups = self.groups[: self.n_scored]
        permuted = np.random.default_rng(shuffle).permutation(self.groups.max() + 1)[groups]
        rest = np.arange(self.n_scored, len(self.rows))
        return [
            (np.concatenate([tr, rest]), te)
            for tr, te in GroupKFold(FOLDS).split(np.zeros(self.n_scored), groups=permuted)
        ]

    def mmlu_of(self, index: np.ndarray) -> np.ndarray:
        return index[index < self.n_mmlu]


Scorer = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(train row indices, test row indices) → scores of the test rows."""


def _logistic(c: float = 1.0, intercept: bool = True) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=3000, fit_intercept=intercept)


def _soft_fit(x: sp.csr_matrix, p: np.ndarray, w: np.ndarray) -> LogisticRegression:
    """Logistic regression on soft labels ``p`` (two weighted rows each), weights ``w``."""
    xs = sp.vstack([x, x]).tocsr()
    y = np.concatenate([np.ones(len(p)), np.zeros(len(p))])
    sw = np.concatenate([w * p, w * (1 - p)])
    keep = sw > 0
    return _logistic().fit(xs[keep], y[keep], sample_weight=sw[keep])


def _logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(p, 1e-6, 1 - 1e-6)
    return np.asarray(np.log(q / (1 - q)))


def v2_scorer(data: Data) -> Scorer:
    """The shipped pipeline's labels and settings (``tiergate train``); returns the logit."""
    position = {r.id: i for i, r in enumerate(data.rows)}

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        labelled = targets([data.rows[i] for i in train], LabelScheme())
        examples, classes, weights = _examples(labelled)
        at = [position[labelled[e].row.id] for e in examples]
        model = _logistic().fit(data.x[at], np.asarray(classes), sample_weight=np.asarray(weights))
        return np.asarray(model.decision_function(data.x[test]))

    return score


@dataclass(frozen=True, slots=True)
class Difficulty:
    """Which outcome the difficulty model predicts: 8B correct, or the mean of both."""

    name: str

    def target(self, data: Data, mmlu: np.ndarray) -> np.ndarray:
        if self.name == "8b":
            return np.asarray(data.weak[mmlu])
        return np.asarray((data.weak[mmlu] + data.strong[mmlu]) / 2)


def _difficulty_logit(data: Data, kind: Difficulty, fit: np.ndarray, at: np.ndarray) -> np.ndarray:
    p = kind.target(data, fit)
    model = _soft_fit(data.x[fit], p, np.ones(len(fit)))
    return np.asarray(model.decision_function(data.x[at]))


def _quadratic(d: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(d)), d, d * d])


def hump_scorer(data: Data, kind: Difficulty) -> Scorer:
    """Quadratic in the predicted difficulty's logit, fitted to the gain on inner OOF rows."""

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        mmlu = data.mmlu_of(train)
        inner = np.zeros(len(mmlu))
        for itr, ite in GroupKFold(INNER_FOLDS).split(mmlu, groups=data.groups[mmlu]):
            inner[ite] = _difficulty_logit(data, kind, mmlu[itr], mmlu[ite])
        coef, *_ = np.linalg.lstsq(_quadratic(inner), data.gain[mmlu], rcond=None)
        return np.asarray(_quadratic(_difficulty_logit(data, kind, mmlu, test)) @ coef)

    return score


def multitask_scorer(data: Data) -> Scorer:
    """P(70B correct) - P(8B correct), two models on the v2 features, both-wrong rows kept."""

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        mmlu = data.mmlu_of(train)
        p = []
        for outcome in (data.strong, data.weak):
            model = _logistic().fit(data.x[mmlu], outcome[mmlu])
            p.append(model.predict_proba(data.x[test])[:, 1])
        return np.asarray(p[0] - p[1])

    return score


def _standardised(train_values: np.ndarray, test_values: np.ndarray) -> np.ndarray:
    return np.asarray((test_values - train_values.mean()) / (train_values.std() + 1e-12))


def sum_scorer(data: Data, first: Scorer, second: Scorer) -> Scorer:
    """Equal-weight sum of two scorers, each standardised on the training folds' MMLU rows."""

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        mmlu = data.mmlu_of(train)
        both = np.concatenate([mmlu, test])
        total = np.zeros(len(test))
        for scorer in (first, second):
            values = scorer(train, both)
            total += _standardised(values[: len(mmlu)], values[len(mmlu) :])
        return total

    return score


def _pairs(
    rng: np.random.Generator, high: np.ndarray, low: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    return rng.choice(high, count), rng.choice(low, count)


def pairwise_scorer(data: Data, weak_labels: bool) -> Scorer:
    """Logistic regression on x_high - x_low of sampled pairs (both orders, no intercept)."""

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(SEED)
        mmlu = data.mmlu_of(train)
        gain = data.gain[mmlu]
        highs: list[np.ndarray] = []
        lows: list[np.ndarray] = []
        levels = [(1.0, 0.0), (0.0, -1.0), (1.0, -1.0)]
        sizes = [float(np.sum(gain == a)) * float(np.sum(gain == b)) for a, b in levels]
        for (a, b), size in zip(levels, sizes, strict=True):
            count = round(MMLU_PAIRS * size / sum(sizes))
            h, lo = _pairs(rng, mmlu[gain == a], mmlu[gain == b], count)
            highs.append(h)
            lows.append(lo)
        if weak_labels:
            arena = train[data.arena[train] & ~data.creative[train]]
            everyday = train[data.everyday[train]]
            h, lo = _pairs(rng, arena, everyday, CHAT_PAIRS)
            highs.append(h)
            lows.append(lo)
            gsm = train[train >= data.n_scored]
            first, second = rng.choice(gsm, GSM8K_PAIRS), rng.choice(gsm, GSM8K_PAIRS)
            differ = data.steps[first] != data.steps[second]
            more = data.steps[first] > data.steps[second]
            highs.append(np.where(more, first, second)[differ])
            lows.append(np.where(more, second, first)[differ])
        high, low = np.concatenate(highs), np.concatenate(lows)
        diff = (data.x[high] - data.x[low]).tocsr()
        x = sp.vstack([diff, -diff]).tocsr()
        y = np.concatenate([np.ones(len(high)), np.zeros(len(high))])
        model = _logistic(intercept=False).fit(x, y)
        return np.asarray(data.x[test] @ model.coef_[0])

    return score


def knn_scorer(data: Data) -> Scorer:
    """Similarity-weighted mean gain of the nearest training MMLU-Pro questions."""

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        mmlu = data.mmlu_of(train)
        similarity = (data.words[test] @ data.words[mmlu].T).toarray()
        top = np.argpartition(-similarity, NEIGHBOURS, axis=1)[:, :NEIGHBOURS]
        weights = np.take_along_axis(similarity, top, axis=1) + 1e-9
        gains = data.gain[mmlu][top]
        return np.asarray((weights * gains).sum(axis=1) / weights.sum(axis=1))

    return score


def _auc(data: Data, test: np.ndarray, scores: np.ndarray) -> float:
    chat = data.arena[test] | data.everyday[test]
    return float(roc_auc_score(data.arena[test][chat], scores[chat]))


def _mean_se(per_shuffle: list[list[float]]) -> tuple[float, float]:
    values = np.array(per_shuffle)
    se = np.mean([np.std(v, ddof=1) / np.sqrt(len(v)) for v in values])
    return float(values.mean()), float(se)


def cross_validate(
    data: Data, scorers: dict[str, Scorer], shuffles: tuple[int, ...] = SHUFFLES
) -> dict[str, dict[str, Any]]:
    """Fold APGR (MMLU-Pro test rows) and everyday-vs-arena-hard AUC of every scorer."""
    apgr: dict[str, list[list[float]]] = {name: [] for name in scorers}
    auc: dict[str, list[list[float]]] = {name: [] for name in scorers}
    seconds = dict.fromkeys(scorers, 0.0)
    for shuffle in shuffles:
        for name in scorers:
            apgr[name].append([])
            auc[name].append([])
        for train, test in data.folds(shuffle):
            mmlu = test < data.n_mmlu
            m = test[mmlu]
            for name, scorer in scorers.items():
                started = time.perf_counter()
                scores = scorer(train, test)
                seconds[name] += time.perf_counter() - started
                curve = cost_quality_curve(scores[mmlu], data.weak[m], data.strong[m])
                apgr[name][-1].append(curve.apgr)
                auc[name][-1].append(_auc(data, test, scores))
    out: dict[str, dict[str, Any]] = {}
    for name in scorers:
        mean, se = _mean_se(apgr[name])
        diff = [
            [a - b for a, b in zip(mine, base, strict=True)]
            for mine, base in zip(apgr[name], apgr["v2_shipped"], strict=True)
        ]
        d_mean, d_se = _mean_se(diff)
        auc_mean, auc_se = _mean_se(auc[name])
        out[name] = {
            "apgr": round(mean, 4),
            "apgr_se": round(se, 4),
            "apgr_per_shuffle": [round(float(np.mean(v)), 4) for v in apgr[name]],
            "minus_v2": round(d_mean, 4),
            "minus_v2_se": round(d_se, 4),
            "everyday_vs_hard_auc": round(auc_mean, 4),
            "everyday_vs_hard_auc_se": round(auc_se, 4),
            "seconds": round(seconds[name], 1),
        }
    return out


def decision(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The rule fixed before the run: ≥ +0.015 APGR over v2 and chat AUC within 0.01 of v2."""
    base = results["v2_shipped"]
    passed = [
        name
        for name, r in results.items()
        if name not in ("v2_shipped", "prompt_length")
        and r["apgr"] - base["apgr"] >= 0.015
        and abs(r["everyday_vs_hard_auc"] - base["everyday_vs_hard_auc"]) <= 0.01
    ]
    return {
        "rule": "CV APGR >= v2 + 0.015 and everyday-vs-hard AUC within 0.01 of v2",
        "passed": passed,
    }


def main() -> None:
    started = time.perf_counter()
    data = Data()
    v2 = v2_scorer(data)
    hump_8b = hump_scorer(data, Difficulty("8b"))
    hump_mean = hump_scorer(data, Difficulty("mean"))
    multitask = multitask_scorer(data)
    scorers: dict[str, Scorer] = {
        "prompt_length": lambda tr, te: data.lengths[te],
        "v2_shipped": v2,
        "difficulty_hump_8b": hump_8b,
        "difficulty_hump_mean": hump_mean,
        "v2_plus_hump": sum_scorer(data, v2, hump_mean),
        "multitask_70b_minus_8b": multitask,
        "v2_plus_multitask": sum_scorer(data, v2, multitask),
        "pairwise_mmlu": pairwise_scorer(data, weak_labels=False),
        "pairwise_mmlu_weak": pairwise_scorer(data, weak_labels=True),
        "knn_gain": knn_scorer(data),
    }
    results = cross_validate(data, scorers)
    stability = cross_validate(
        data, {"v2_shipped": v2, "multitask_70b_minus_8b": multitask}, EXTRA_SHUFFLES
    )
    result = {
        "what": (
            "grouped 5-fold CV on the training split (MMLU-Pro, everyday and arena-hard rows "
            "folded by group; GSM8K always in training; validation never read)"
        ),
        "mmlu_train_rows": data.n_mmlu,
        "folds": FOLDS,
        "shuffles": list(SHUFFLES),
        "seed": SEED,
        "routers": results,
        "decision": decision(results),
        "stability": {
            "what": (
                "the best APGR idea of the main run against v2 on three further group "
                "shuffles (chosen after seeing the main run; a check, not a selection)"
            ),
            "shuffles": list(EXTRA_SHUFFLES),
            "routers": stability,
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", "utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
