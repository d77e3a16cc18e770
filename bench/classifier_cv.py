"""Cross-validated evidence behind the complexity classifier (docs/classifier.md), train split only.

**A record of round 2, run at commit caaa798 (model text version 2, one model, the v2 labels).**
Later code changed what it imports: model text version 3, the experts' labels in
``router/training/labels.py``. Rerun at a later commit it trains on those and its figures
differ from ``bench/results/classifier_cv.json``; check out caaa798 to reproduce them.

Everything here uses the **training split** of ``data/routing`` (seed 0, the split
``tiergate train`` uses); the validation split is never read. MMLU-Pro training rows are cut into
5 folds grouped by question (``group_key``, as the train/validation split is), twice with
different group shuffles; each fold is scored by a model fitted on the other four plus every
non-MMLU training row (the weak labels), and the figure is the mean of the ten fold APGRs.

* ``routers``: APGR of the prompt-length router, of the pipeline on model-text version 1 (the
  five structural tokens) and on version 2 (plus the question-shape tokens), same labels and
  pipeline settings as ``tiergate train``.
* ``category_oracle``: the MMLU-Pro category *given* (a live prompt has none), scored by its mean
  gain strong - weak on the other folds: the most any subject predictor could give.
* ``gain_by_difficulty``: how the gain varies with predicted difficulty (out-of-fold P(8B
  correct) from TF-IDF word 1-2-grams, in deciles): if it is flat, difficulty alone cannot rank.
* ``latent_difficulty_bound``: a one-dimensional item-response model fitted to the outcome rates
  (8B and 70B accuracy, their covariance; 10 % guessing floor). For a difficulty predictor of a
  given ROC AUC against "8B correct", the APGR of the best use of it, E[gain | prediction].

    OPENBLAS_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/classifier_cv.py   # ~1 minute
    # writes bench/results/classifier_cv.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold

from router.classifier import meta_tokens
from router.features import PromptFeatures, clip
from router.training.apgr import cost_quality_curve
from router.training.data import Row, group_key, load_rows
from router.training.evaluate import split_rows
from router.training.labels import LabelScheme, targets
from router.training.pipeline import PipelineConfig, build_pipeline
from router.training.train import _examples

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "classifier_cv.json"
FOLDS = 5
SHUFFLES = (0, 1)
V1_TOKENS = 5
"""Model-text version 1 had the first five structural tokens only."""


def _model_text(features: PromptFeatures, version: int) -> str:
    tokens = meta_tokens(features).split()
    if version == 1:
        tokens = tokens[:V1_TOKENS]
    return " ".join(tokens) + "\n" + clip(features.last_user_text)


class Data:
    def __init__(self) -> None:
        rows = load_rows(REPO / "data" / "routing")
        train, _ = split_rows(rows, seed=0, fraction=0.2)
        self.mmlu = [r for r in train if r.source == "mmlu_pro"]
        self.other = [r for r in train if r.source != "mmlu_pro"]
        self.weak = np.array([float(bool(r.weak_correct)) for r in self.mmlu])
        self.strong = np.array([float(bool(r.strong_correct)) for r in self.mmlu])
        self.gain = self.strong - self.weak
        self.categories = np.array([r.category or "" for r in self.mmlu])
        _, self.groups = np.unique([group_key(r.prompt) for r in self.mmlu], return_inverse=True)
        self.features = [PromptFeatures.from_text(r.prompt) for r in self.mmlu + self.other]

    def folds(self, shuffle: int) -> list[tuple[np.ndarray, np.ndarray]]:
        permuted = np.random.default_rng(shuffle).permutation(self.groups.max() + 1)[self.groups]
        return list(GroupKFold(FOLDS).split(self.mmlu, groups=permuted))

    def apgr(self, scores: np.ndarray, index: np.ndarray) -> float:
        """APGR of ``scores``, the scores of the rows ``index``."""
        return cost_quality_curve(scores, self.weak[index], self.strong[index]).apgr


Scorer = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(train fold indices, test fold indices) → scores of the test fold."""


def _cv(data: Data, scorer: Scorer) -> dict[str, Any]:
    per_shuffle = []
    for shuffle in SHUFFLES:
        folds = data.folds(shuffle)
        per_shuffle.append(float(np.mean([data.apgr(scorer(tr, te), te) for tr, te in folds])))
    return {
        "apgr_per_shuffle": [round(v, 4) for v in per_shuffle],
        "apgr": round(float(np.mean(per_shuffle)), 4),
    }


def _pipeline_scorer(data: Data, version: int) -> Scorer:
    config = PipelineConfig()
    pipeline = build_pipeline(config)
    texts = [_model_text(f, version) for f in data.features]
    matrix = pipeline.named_steps["features"].fit_transform(texts).tocsr()
    n = len(data.mmlu)
    rows: list[Row] = data.mmlu + data.other

    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        index = [*train.tolist(), *range(n, len(rows))]
        position = {rows[i].id: i for i in index}
        labelled = targets([rows[i] for i in index], LabelScheme())
        examples, classes, weights = _examples(labelled)
        at = [position[labelled[e].row.id] for e in examples]
        model = pipeline.named_steps["model"]
        model.fit(matrix[at], np.asarray(classes), sample_weight=np.asarray(weights))
        return np.asarray(model.predict_proba(matrix[test])[:, 1])

    return score


def _category_oracle(data: Data) -> Scorer:
    def score(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        means = {
            c: float(data.gain[train][data.categories[train] == c].mean())
            for c in set(data.categories)
        }
        return np.array([means[c] for c in data.categories[test]])

    return score


def _gain_by_difficulty(data: Data) -> dict[str, Any]:
    prompts = [r.prompt for r in data.mmlu]
    predicted = np.zeros(len(prompts))
    aucs = []
    for train, test in data.folds(0):
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
        x_train = vectorizer.fit_transform([prompts[i] for i in train])
        model = LogisticRegression(C=1.0, max_iter=2000).fit(x_train, data.weak[train])
        predicted[test] = model.predict_proba(vectorizer.transform([prompts[i] for i in test]))[
            :, 1
        ]
        aucs.append(roc_auc_score(data.weak[test], predicted[test]))
    edges = np.quantile(predicted, np.linspace(0, 1, 11))
    decile = np.clip(np.searchsorted(edges, predicted, side="right") - 1, 0, 9)
    table = [
        {
            "decile": d + 1,
            "predicted_8b_accuracy": round(float(predicted[decile == d].mean()), 3),
            "8b_accuracy": round(float(data.weak[decile == d].mean()), 3),
            "70b_accuracy": round(float(data.strong[decile == d].mean()), 3),
            "mean_gain": round(float(data.gain[decile == d].mean()), 3),
        }
        for d in range(10)
    ]
    return {"auc_8b_correct": round(float(np.mean(aucs)), 4), "deciles": table}


def _latent_difficulty_bound(data: Data, draws: int = 200_000) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    z = rng.standard_normal(draws)
    floor = 0.1
    weak_rate, strong_rate = float(data.weak.mean()), float(data.strong.mean())
    covariance = float(np.cov(data.weak, data.strong)[0, 1])

    def probabilities(spread: float) -> tuple[np.ndarray, np.ndarray]:
        d = spread * z

        def rate(a: float) -> np.ndarray:
            return np.asarray(floor + (1 - floor) * expit(a - d))

        a = brentq(lambda a: float(rate(a).mean()) - weak_rate, -30, 30)
        b = brentq(lambda b: float(rate(b).mean()) - strong_rate, -30, 30)
        return rate(a), rate(b)

    spread = brentq(lambda s: float(np.cov(*probabilities(s))[0, 1]) - covariance, 0.01, 30)
    p_weak, p_strong = probabilities(spread)
    mu = p_strong - p_weak
    weak_draw = rng.random(draws) < p_weak

    def apgr_of(scores: np.ndarray) -> float:
        rank = np.argsort(np.argsort(scores)) / draws
        return float(0.5 + np.cov(mu, rank)[0, 1] / mu.mean())

    rows = []
    for noise in (0.0, 2.0, 4.0, 6.0, 8.0, 12.0):
        predicted = -spread * z + noise * rng.standard_normal(draws)
        edges = np.quantile(predicted, np.linspace(0, 1, 51))
        bins = np.clip(np.searchsorted(edges, predicted) - 1, 0, 49)
        best_use = (np.bincount(bins, weights=mu) / np.bincount(bins))[bins]
        rows.append(
            {
                "auc_8b_correct": round(float(roc_auc_score(weak_draw, predicted)), 3),
                "best_apgr": round(apgr_of(best_use), 4),
            }
        )
    return {
        "difficulty_sd_logits": round(spread, 3),
        "gain_sd": round(float(mu.std()), 4),
        "by_predictor": rows,
    }


def main() -> None:
    data = Data()
    lengths = np.array([len(r.prompt) for r in data.mmlu], dtype=np.float64)
    result = {
        "what": "grouped 5-fold CV on the MMLU-Pro training split (validation never read)",
        "mmlu_train_rows": len(data.mmlu),
        "folds": FOLDS,
        "shuffles": list(SHUFFLES),
        "routers": {
            "prompt_length": _cv(data, lambda tr, te: lengths[te]),
            "model_text_v1": _cv(data, _pipeline_scorer(data, 1)),
            "model_text_v2": _cv(data, _pipeline_scorer(data, 2)),
        },
        "category_oracle": _cv(data, _category_oracle(data)),
        "gain_by_difficulty": _gain_by_difficulty(data),
        "latent_difficulty_bound": _latent_difficulty_bound(data),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", "utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
