"""Validation metrics for a complexity classifier, and the default threshold.

All numbers are computed on the validation split (``router.training.data.is_validation``):

* ``mmlu_auc``: ROC AUC of the score against the strict target (8B wrong, 70B right) over every
  MMLU-Pro validation row; ``mmlu_auc_excluding_both_wrong`` the same without the both-wrong
  rows; ``mmlu_auc_weak_wrong`` against "8B wrong" alone.
* ``everyday_vs_hard_auc``: everyday instructions (0) against arena-hard prompts (1).
* ``routed``: MMLU-Pro accuracy when prompts scoring ≥ threshold go to 70B, next to all-8B,
  all-70B and random routing with the same large share.
* ``threshold``: the score at which ``target_large_share`` of the *mix* goes large; the mix
  gives equal weight to four groups: everyday instructions, arena-hard, MMLU-Pro and GSM8K.
* ``share_thresholds``: the same for every share 0 %, 1 %, …, 100 % (the share curve the model
  file ships; ``SklearnClassifier.threshold_for_share`` reads it).
* ``mmlu_apgr``: APGR (``router.training.apgr``) on the MMLU-Pro validation rows with the 8B
  and 70B outcomes as qualities, with a bootstrap 95 % interval, next to the prompt-length
  router's and the paired difference.
* ``gsm8k_steps_spearman``: Spearman correlation of the score with the reference solution's
  step count on the GSM8K validation rows, next to prompt length's. ``gsm8k_proxy_apgr``: APGR
  there with the gain the labels assume (weak 0, strong = the step label of
  ``router.training.labels``), as ``mmlu_apgr`` with its intervals. A proxy: GSM8K carries no
  model outcomes.
* ``multiple_choice_share``: per group, the share of rows the gate sends to the
  multiple-choice expert.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from router.experts import MULTIPLE_CHOICE, expert_for
from router.features import PromptFeatures
from router.sklearn_classifier import SklearnClassifier
from router.training.apgr import compare_routers, length_scores
from router.training.data import Row, is_validation, load_rows, row_group
from router.training.labels import (
    ARENA_HARD_SOURCES,
    EVERYDAY_SOURCES,
    OBVIOUS_SOURCE,
    LabelScheme,
    needs_large,
    targets,
)

__all__ = [
    "MIX_GROUPS",
    "SHARE_POINTS",
    "EvalReport",
    "evaluate",
    "evaluate_rows",
    "mix_group",
    "pairwise_auc",
    "share_curve",
    "split_rows",
]

SHARE_POINTS = 101
"""The share curve's resolution: shares 0, 0.01, …, 1."""
BOOTSTRAP_RESAMPLES = 1000

MIX_GROUPS = ("everyday", "arena_hard", "mmlu_pro", "gsm8k", "zeroeval_math_l5", "zeroeval_crux")
MIX_WEIGHTS = {
    "everyday": 0.4,
    "arena_hard": 0.2,
    "mmlu_pro": 0.1,
    "gsm8k": 0.1,
    "zeroeval_math_l5": 0.1,
    "zeroeval_crux": 0.1,
}
"""The documented mix the share curve and the default threshold are read on: everyday chat
(self-instruct, vicuna bench) 40 %, arena-hard 20 %, and 10 % each of MMLU-Pro, GSM8K, MATH
and CRUXEval, since a gateway's traffic is mostly chat, not exams."""


def mix_group(row: Row) -> str:
    if row.source in EVERYDAY_SOURCES:
        return "everyday"
    if row.source in ARENA_HARD_SOURCES:
        return "arena_hard"
    if row.source == "gsm8k_train":
        return "gsm8k"
    return row.source


def split_rows(rows: Sequence[Row], *, seed: int, fraction: float) -> tuple[list[Row], list[Row]]:
    """(train, validation), grouped by normalised question text."""
    train: list[Row] = []
    validation: list[Row] = []
    for row in rows:
        if row.split is not None:  # the obvious cases come split
            (validation if row.split == "holdout" else train).append(row)
            continue
        side = is_validation(row_group(row), seed=seed, fraction=fraction)
        (validation if side else train).append(row)
    return train, validation


@dataclass(frozen=True, slots=True)
class EvalReport:
    n_validation: dict[str, int]
    mmlu_auc: float
    mmlu_auc_excluding_both_wrong: float
    mmlu_auc_weak_wrong: float
    everyday_vs_hard_auc: float
    gsm8k_mean_score_by_steps: dict[str, float]
    score_quantiles: dict[str, dict[str, float]]
    """Per mix group: the 10th, 50th and 90th percentile of the score."""
    score_histogram: list[int]
    """Validation rows of the mix per score decile [0, 0.1), …, [0.9, 1]."""
    threshold: float
    target_large_share: float
    large_share: dict[str, float]
    """Share at or above ``threshold``: per group and for the equal-weight ``mix``."""
    routed: dict[str, float] = field(default_factory=dict)
    share_thresholds: list[float] = field(default_factory=list)
    mmlu_apgr: dict[str, dict[str, object]] = field(default_factory=dict)
    gsm8k_steps_spearman: dict[str, float] = field(default_factory=dict)
    gsm8k_proxy_apgr: dict[str, dict[str, object]] = field(default_factory=dict)
    multiple_choice_share: dict[str, float] = field(default_factory=dict)
    family_apgr: dict[str, dict[str, dict[str, object]]] = field(default_factory=dict)
    """MATH level 5 and CRUXEval: APGR with the 8B / 70B flags, as ``mmlu_apgr``."""
    obvious: dict[str, float] = field(default_factory=dict)
    """The obvious cases' holdout half: pairwise AUC (hard above easy), the share of easy
    prompts at or above the threshold and of hard ones below it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pairwise_auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties counting half (no numpy needed)."""
    wins = 0.0
    for p in positive:
        for n in negative:
            wins += 1.0 if p > n else 0.5 if p == n else 0.0
    return wins / (len(positive) * len(negative))


def _auc(labels: Sequence[bool], scores: Sequence[float]) -> float:
    if len(set(labels)) < 2:
        return float("nan")
    return round(float(roc_auc_score(np.asarray(labels), np.asarray(scores))), 4)


def _unrounded_threshold(scores: Mapping[str, np.ndarray], share: float) -> float:
    present = {name: values for name, values in scores.items() if len(values)}
    total = sum(MIX_WEIGHTS.get(name, 1.0) for name in present)
    values = np.concatenate(list(present.values()))
    weights = np.concatenate(
        [np.full(len(g), MIX_WEIGHTS.get(n, 1.0) / (len(g) * total)) for n, g in present.items()]
    )
    order = np.argsort(-values, kind="stable")
    cumulative = np.cumsum(weights[order])
    position = min(int(np.searchsorted(cumulative, share)), len(values) - 1)
    return float(values[order][position])


def choose_threshold(scores: Mapping[str, np.ndarray], share: float) -> float:
    """The score at which ``share`` of the equal-weight mix of ``scores`` groups goes large."""
    return round(_unrounded_threshold(scores, share), 3)


def share_curve(scores: Mapping[str, np.ndarray], points: int = SHARE_POINTS) -> list[float]:
    """Thresholds for shares 0, 1/(points-1), …, 1 of the equal-weight mix (non-increasing)."""
    if not any(len(values) for values in scores.values()):
        return []
    shares = np.linspace(0.0, 1.0, points)
    return [round(_unrounded_threshold(scores, float(share)), 6) for share in shares]


def _mmlu_apgr(
    rows: Sequence[Row], scores: np.ndarray, resamples: int
) -> dict[str, dict[str, object]]:
    weak = [float(bool(row.weak_correct)) for row in rows]
    strong = [float(bool(row.strong_correct)) for row in rows]
    return _apgr(rows, scores, weak, strong, resamples)


def _gsm8k_proxy_apgr(
    rows: Sequence[Row], scores: np.ndarray, resamples: int
) -> dict[str, dict[str, object]]:
    gains = [target.p for target in targets(rows, LabelScheme())]
    return _apgr(rows, scores, [0.0] * len(gains), gains, resamples)


def _gsm8k_spearman(rows: Sequence[Row], scores: np.ndarray) -> dict[str, float]:
    if len(rows) < 2:
        return {}
    steps = [row.solution_steps or 0 for row in rows]
    routers = {"classifier": scores, "prompt_length": length_scores([r.prompt for r in rows])}
    return {name: round(float(spearmanr(v, steps)[0]), 4) for name, v in routers.items()}


def _apgr(
    rows: Sequence[Row],
    scores: np.ndarray,
    weak: Sequence[float],
    strong: Sequence[float],
    resamples: int,
) -> dict[str, dict[str, object]]:
    if not rows:
        return {}
    routers = {"classifier": scores, "prompt_length": length_scores([r.prompt for r in rows])}
    result = compare_routers(routers, weak, strong, resamples=resamples, baseline="prompt_length")
    return {
        name: {k: round(v, 4) if isinstance(v, float) else _round_list(v) for k, v in m.items()}
        for name, m in result.items()
    }


def _round_list(value: object) -> object:
    if isinstance(value, list):
        return [round(float(v), 4) for v in value]
    return value


def _mix_share(scores: Mapping[str, np.ndarray], threshold: float) -> dict[str, float]:
    shares = {name: float(np.mean(values >= threshold)) for name, values in scores.items()}
    present = [name for name, values in scores.items() if len(values)]
    total = sum(MIX_WEIGHTS.get(name, 1.0) for name in present)
    shares["mix"] = (
        sum(shares[n] * MIX_WEIGHTS.get(n, 1.0) for n in present) / total if present else math.nan
    )
    return {name: round(value, 4) for name, value in shares.items()}


def _routed(rows: Sequence[Row], scores: np.ndarray, threshold: float) -> dict[str, float]:
    weak = np.array([bool(row.weak_correct) for row in rows], dtype=float)
    strong = np.array([bool(row.strong_correct) for row in rows], dtype=float)
    large = scores >= threshold
    share = float(np.mean(large))
    routed = float(np.mean(np.where(large, strong, weak)))
    random = float(np.mean(weak) + share * (np.mean(strong) - np.mean(weak)))
    result = {
        "large_share": share,
        "accuracy": routed,
        "accuracy_random_same_share": random,
        "accuracy_all_small": float(np.mean(weak)),
        "accuracy_all_large": float(np.mean(strong)),
    }
    return {name: round(value, 4) for name, value in result.items()}


def _obvious(rows: Sequence[Row], scores: np.ndarray, threshold: float) -> dict[str, float]:
    at = [i for i, row in enumerate(rows) if row.source == OBVIOUS_SOURCE]
    if not at:
        return {}
    hard = np.array([rows[i].difficulty == "hard" for i in at])
    values = scores[at]
    return {
        "n": len(at),
        "auc": _auc(hard.tolist(), values.tolist()),
        "easy_large": round(float(np.mean(values[~hard] >= threshold)), 4),
        "hard_small": round(float(np.mean(values[hard] < threshold)), 4),
    }


def evaluate_rows(
    classifier: SklearnClassifier,
    validation: Sequence[Row],
    *,
    target_large_share: float,
    threshold: float | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> EvalReport:
    """Metrics over ``validation``; ``threshold=None`` chooses it for ``target_large_share``.

    ``resamples`` is the number of bootstrap resamples behind ``mmlu_apgr``'s intervals.
    """
    features = [PromptFeatures.from_text(row.prompt) for row in validation]
    scores = np.asarray(classifier.score_features(features)) if features else np.zeros(0)
    groups = np.array([mix_group(row) for row in validation])
    multiple_choice = np.array([expert_for(f) == MULTIPLE_CHOICE for f in features], dtype=bool)
    by_group = {name: scores[groups == name] for name in MIX_GROUPS}
    if threshold is None:
        threshold = choose_threshold(by_group, target_large_share)

    mmlu = [i for i, row in enumerate(validation) if row.source == "mmlu_pro"]
    mmlu_rows = [validation[i] for i in mmlu]
    mmlu_scores = scores[mmlu]
    answered = [j for j, row in enumerate(mmlu_rows) if row.weak_correct or row.strong_correct]
    contrast = [i for i, g in enumerate(groups) if g in ("everyday", "arena_hard")]
    gsm8k_rows = [row for row, g in zip(validation, groups, strict=True) if g == "gsm8k"]
    steps = np.array([row.solution_steps or 0 for row in validation])
    gsm8k = {
        str(n): round(float(np.mean(scores[(groups == "gsm8k") & (steps == n)])), 4)
        for n in sorted(set(steps[groups == "gsm8k"].tolist()))
    }
    mix = scores[np.isin(groups, MIX_GROUPS)]
    return EvalReport(
        n_validation={name: len(values) for name, values in by_group.items()},
        mmlu_auc=_auc([bool(needs_large(r)) for r in mmlu_rows], mmlu_scores.tolist()),
        mmlu_auc_excluding_both_wrong=_auc(
            [bool(needs_large(mmlu_rows[j])) for j in answered], mmlu_scores[answered].tolist()
        ),
        mmlu_auc_weak_wrong=_auc([not r.weak_correct for r in mmlu_rows], mmlu_scores.tolist()),
        everyday_vs_hard_auc=_auc(
            [groups[i] == "arena_hard" for i in contrast], scores[contrast].tolist()
        ),
        gsm8k_mean_score_by_steps=gsm8k,
        score_quantiles={
            name: {
                q: round(float(np.quantile(values, float(q[1:]) / 100)), 4)
                for q in ("p10", "p50", "p90")
            }
            for name, values in by_group.items()
            if len(values)
        },
        score_histogram=np.histogram(mix, bins=10, range=(0.0, 1.0))[0].tolist(),
        threshold=threshold,
        target_large_share=target_large_share,
        large_share=_mix_share(by_group, threshold),
        routed=_routed(mmlu_rows, mmlu_scores, threshold) if mmlu_rows else {},
        share_thresholds=share_curve(by_group),
        mmlu_apgr=_mmlu_apgr(mmlu_rows, mmlu_scores, resamples),
        gsm8k_steps_spearman=_gsm8k_spearman(gsm8k_rows, scores[groups == "gsm8k"]),
        gsm8k_proxy_apgr=_gsm8k_proxy_apgr(gsm8k_rows, scores[groups == "gsm8k"], resamples),
        family_apgr={
            source: _mmlu_apgr(
                [r for r in validation if r.source == source],
                scores[[i for i, r in enumerate(validation) if r.source == source]],
                resamples,
            )
            for source in ("zeroeval_math_l5", "zeroeval_crux")
        },
        obvious=_obvious(validation, scores, threshold),
        multiple_choice_share={
            name: round(float(np.mean(multiple_choice[groups == name])), 4)
            for name in MIX_GROUPS
            if np.any(groups == name)
        },
    )


def evaluate(
    classifier: SklearnClassifier,
    data_dir: Path,
    *,
    seed: int | None = None,
    validation_fraction: float | None = None,
    target_large_share: float | None = None,
) -> EvalReport:
    """Evaluate ``classifier`` on the validation split of ``data_dir``.

    Arguments left ``None`` come from the model file's metadata (defaults: seed 0, a 20 %
    validation split, a 40 % target share), so a shipped model is scored on the rows it was
    not trained on; the threshold is the model's own when it records one.
    """
    meta = classifier.metadata
    seed = int(meta.get("seed", 0)) if seed is None else seed
    fraction = (
        float(meta.get("validation_fraction", 0.2))
        if validation_fraction is None
        else validation_fraction
    )
    share = (
        float(meta.get("target_large_share", 0.4))
        if target_large_share is None
        else target_large_share
    )
    _, validation = split_rows(load_rows(data_dir), seed=seed, fraction=fraction)
    return evaluate_rows(
        classifier,
        validation,
        target_large_share=share,
        threshold=classifier.threshold,
        resamples=int(meta.get("bootstrap_resamples", BOOTSTRAP_RESAMPLES)),
    )
