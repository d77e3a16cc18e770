"""Training the complexity classifier: data → labels → pipeline → metrics → model file + card
+ serving export.

Reproducible: the split is a keyed hash of each row's group, the solver is deterministic, and
nothing depends on row order or the clock, so the same data and seed give the same model and
the same metrics (the card's ``seconds`` aside). The fits run on one thread: scikit-learn sums
the logistic loss over OpenMP threads, and another thread count sums in another order, which
moved the open expert's scores by up to 0.01 (lbfgs stops at its tolerance, not at the exact
optimum) and the card's metrics in their third decimal. One thread is also the faster here.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
import skops
from threadpoolctl import threadpool_limits

from router.classifier import MODEL_TEXT_VERSION, model_text_of
from router.experts import MULTIPLE_CHOICE, OPEN, PROBABILITY
from router.model_file import card_path, save_classifier
from router.sklearn_classifier import SklearnClassifier, SklearnExpert
from router.training.blend import apply_length_slopes
from router.training.data import DATA_FILES, Row, load_rows
from router.training.evaluate import EvalReport, evaluate_rows, split_rows
from router.training.export import export_model_file
from router.training.labels import LabelScheme, Target, training_targets
from router.training.pipeline import (
    MULTIPLE_CHOICE_PIPELINE,
    OPEN_PIPELINE,
    PipelineConfig,
    build_pipeline,
)

__all__ = ["LENGTH_SLOPES", "STAGES", "Progress", "TrainConfig", "TrainReport", "train"]

Progress = Callable[[str, int, int], None]
"""``progress(stage, completed, total)``: called as each stage starts, and with ``"done"``."""
STAGES = ("load", "fit", "evaluate", "save")
CARD_NOTES = (
    "One model for every kind of prompt (both experts of the file serve it): the expected gain "
    "E[70B correct - 8B correct], learnt from the IRT gain of the MMLU-Pro, MATH and CRUXEval "
    "outcome matrices, from weak labels (everyday 0, arena-hard 0.45, GSM8K by steps) and the "
    "obvious cases' train half; on model text v4, format taken off (router/prompt_text.py). "
    "See router/training/labels.py.",
    "Not calibrated as a probability: use the threshold (chosen for target_large_share of an "
    "equal-weight mix of everyday chat, arena-hard, MMLU-Pro, GSM8K, MATH and CRUXEval "
    "validation prompts) or the share curve (metrics.share_thresholds), not 0.5.",
    "Metrics are on a validation split grouped by normalised question text (seed above); the "
    "obvious cases' holdout half is their own family.",
)


LENGTH_SLOPES: dict[str, float] = {"mc": 0.05, "code": 0.0, "math": 0.0, "txt": 0.0}
"""The blend's length slope per kind of prompt (``router.training.blend``), chosen on the
grouped CV of ``bench/classifier_families.py``."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    labels: LabelScheme = field(default_factory=LabelScheme)
    open_pipeline: PipelineConfig = OPEN_PIPELINE
    multiple_choice_pipeline: PipelineConfig = MULTIPLE_CHOICE_PIPELINE
    validation_fraction: float = 0.2
    target_large_share: float = 0.35
    """Share of the everyday/hard mix the default threshold sends to the large tier."""
    max_rows_per_source: int | None = None
    """Subsample each source to at most this many rows (quick runs and tests)."""
    bootstrap_resamples: int = 1000
    """Resamples behind the validation APGR intervals (fewer: quicker, rougher)."""
    length_slopes: tuple[tuple[str, float], ...] = tuple(sorted(LENGTH_SLOPES.items()))
    """Per kind, the slope added to the logit per length step (the blend with length)."""


@dataclass(frozen=True, slots=True)
class TrainReport:
    model_path: Path
    card_path: Path
    export_path: Path
    """The serving export written beside the model (``router.serving_export``)."""
    seed: int
    n_train_rows: dict[str, int]
    """Labelled rows per source (``<source>_variant``: format variants)."""
    n_train_examples: dict[str, int]
    """Weighted examples the model was fitted on (a soft label counts twice)."""
    evaluation: EvalReport
    model_bytes: int
    seconds: float

    @property
    def threshold(self) -> float:
        return self.evaluation.threshold


def _subsample(rows: Sequence[Row], limit: int | None, seed: int) -> list[Row]:
    if limit is None:
        return list(rows)

    def rank(row: Row) -> bytes:
        return hashlib.blake2b(f"{seed}\x00{row.id}".encode(), digest_size=8).digest()

    kept: set[str] = set()
    for source in sorted({row.source for row in rows}):
        of_source = sorted((row for row in rows if row.source == source), key=rank)
        kept.update(row.id for row in of_source[:limit])
    return [row for row in rows if row.id in kept]


def _examples(labelled: Sequence[Target]) -> tuple[list[int], list[int], list[float]]:
    """Soft labels as weighted hard ones: (row index, class, weight) columns."""
    index: list[int] = []
    classes: list[int] = []
    weights: list[float] = []
    for i, target in enumerate(labelled):
        for cls, weight in ((1, target.weight * target.p), (0, target.weight * (1 - target.p))):
            if weight > 0:
                index.append(i)
                classes.append(cls)
                weights.append(weight)
    return index, classes, weights


def _fit_experts(config: TrainConfig, labelled: Sequence[Target]) -> dict[str, SklearnExpert]:
    """One pipeline for every kind of prompt; both experts of the model file serve it."""
    pipeline = _fit_expert(config.open_pipeline, labelled, config.length_slopes)
    return {
        MULTIPLE_CHOICE: SklearnExpert(pipeline, PROBABILITY),
        OPEN: SklearnExpert(pipeline, PROBABILITY),
    }


def _fit_expert(
    config: PipelineConfig, labelled: Sequence[Target], slopes: Sequence[tuple[str, float]] = ()
) -> Any:
    """A pipeline built from ``config``, fitted to ``labelled``, with the length slopes."""
    pipeline = build_pipeline(config)
    texts = [model_text_of(t.row.prompt) for t in labelled]
    _fit_model(pipeline, pipeline.named_steps["features"].fit_transform(texts).tocsr(), labelled)
    if slopes:
        vocabulary = {token for text in texts for token in text.split("\n", 1)[0].split()}
        apply_length_slopes(pipeline, dict(slopes), vocabulary)
    return pipeline


def _fit_model(pipeline: Any, matrix: Any, labelled: Sequence[Target]) -> None:
    index, classes, weights = _examples(labelled)
    pipeline.named_steps["model"].fit(
        matrix[index], np.asarray(classes), sample_weight=np.asarray(weights)
    )


def _count_by_source(labelled: Sequence[Target]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for target in labelled:
        key = target.row.source + ("_variant" if target.row.id.endswith("~4") else "")
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _file_digests(data_dir: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((data_dir / name).read_bytes()).hexdigest()
        for name in DATA_FILES
        if (data_dir / name).is_file()
    }


def _card(report: TrainReport, config: TrainConfig, data_dir: Path) -> dict[str, Any]:
    return {
        "model": report.model_path.name,
        "description": "Expected gain of Llama-3.1-70B over 8B, from prompt text, by two experts",
        "notes": list(CARD_NOTES),
        "threshold": report.threshold,
        "seed": report.seed,
        "config": asdict(config),
        "training": {
            "rows": report.n_train_rows,
            "examples": report.n_train_examples,
            "seconds": report.seconds,
            "data_sha256": _file_digests(data_dir),
        },
        "metrics": report.evaluation.to_dict(),
        "versions": {
            "model_text": MODEL_TEXT_VERSION,
            "sklearn": sklearn.__version__,
            "skops": skops.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "model_bytes": report.model_bytes,
    }


def train(
    data_dir: Path,
    out: Path,
    seed: int = 0,
    progress: Progress | None = None,
    *,
    config: TrainConfig | None = None,
) -> TrainReport:
    """Train on ``data_dir``, write the model to ``out`` (``.skops``), its card and its
    serving export beside it.

    The card (``out`` with suffix ``.json``) holds the threshold, metrics and versions; the
    serving export (``.serving.json``) is what ``tiergate serve`` scores with.
    """
    config = config or TrainConfig()
    started = time.perf_counter()

    def step(stage: str) -> None:
        if progress is not None:
            done = STAGES.index(stage) if stage in STAGES else len(STAGES)
            progress(stage, done, len(STAGES))

    step("load")
    rows = _subsample(load_rows(data_dir), config.max_rows_per_source, seed)
    train_rows, validation = split_rows(rows, seed=seed, fraction=config.validation_fraction)
    labelled = training_targets(train_rows, config.labels)
    step("fit")
    with threadpool_limits(limits=1):
        experts = _fit_experts(config, labelled)
    classifier = SklearnClassifier(experts)

    step("evaluate")
    evaluation = evaluate_rows(
        classifier,
        validation,
        target_large_share=config.target_large_share,
        resamples=config.bootstrap_resamples,
    )
    classifier.metadata.update(
        threshold=evaluation.threshold,
        seed=seed,
        validation_fraction=config.validation_fraction,
        target_large_share=config.target_large_share,
        share_thresholds=evaluation.share_thresholds,
        bootstrap_resamples=config.bootstrap_resamples,
    )
    step("save")
    save_classifier(classifier, out)
    export = export_model_file(out)
    report = TrainReport(
        model_path=out,
        card_path=card_path(out),
        export_path=export,
        seed=seed,
        n_train_rows=_count_by_source(labelled),
        n_train_examples={"all": len(_examples(labelled)[0])},
        evaluation=evaluation,
        model_bytes=out.stat().st_size,
        seconds=round(time.perf_counter() - started, 1),
    )
    card = _card(report, config, data_dir)
    report.card_path.write_text(json.dumps(card, indent=2, sort_keys=False) + "\n", "utf-8")
    step("done")
    return report
