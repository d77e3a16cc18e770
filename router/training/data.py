"""Reading the routing data (``data/routing/``) and splitting it without leakage.

Every file is JSON Lines (``.jsonl`` or gzip-compressed ``.jsonl.gz``) with at least ``id``,
``source`` and ``prompt``; see ``data/routing/README.md`` for the fields of each file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from router.training.irt import fit_2pl

__all__ = [
    "DATA_FILES",
    "GROUP_PREFIX_CHARS",
    "OBVIOUS_FILE",
    "OUTCOME_FILES",
    "Row",
    "group_key",
    "irt_gains",
    "is_validation",
    "load_rows",
    "question_stem",
    "row_group",
]

OUTCOME_FILES = (
    "outcomes/mmlu_pro_train_models.jsonl.gz",
    "outcomes/zeroeval_math_l5.jsonl",
    "outcomes/zeroeval_crux.jsonl",
)
"""Per-question outcomes of many models (``data/routing/outcomes/README.md``)."""
OBVIOUS_FILE = "obvious/obvious_cases.jsonl"
"""Hand-written easy / hard prompts, each with its ``split`` (train or holdout)."""
WEAK_COLUMN = "Meta-Llama-3.1-8B-Instruct"
STRONG_COLUMN = "Meta-Llama-3.1-70B-Instruct"
IRT_FLOOR = {"mmlu_pro": 0.05}
"""Guessing floor of the IRT fit per source (ten options; the others are open answers)."""
DATA_FILES = (
    *OUTCOME_FILES,
    OBVIOUS_FILE,
    "gsm8k_train.jsonl.gz",
    "self_instruct_seed_tasks.jsonl",
    "self_instruct_user_oriented.jsonl",
    "vicuna_bench.jsonl",
    "arena_hard_v0.1.jsonl",
    "arena_hard_v2.0.jsonl",
)
GROUP_PREFIX_CHARS = 120
"""Rows whose normalised question stems share this many leading characters form one group:
repeated questions, and questions built on the same passage or template, stay on one side."""

_FIRST_OPTION = re.compile(r"\nA\. ")
_NON_WORD = re.compile(r"\W+")


@dataclass(frozen=True, slots=True)
class Row:
    """One prompt of the training data, with whatever outcome its file records."""

    id: str
    source: str
    prompt: str
    category: str | None = None
    weak_correct: bool | None = None
    strong_correct: bool | None = None
    solution_steps: int | None = None
    gain: float | None = None
    """P(70B right) - P(8B right) from the IRT fit of the row's outcome file."""
    difficulty: str | None = None
    """``easy`` or ``hard`` (the obvious cases)."""
    split: str | None = None
    """``train`` or ``holdout`` (the obvious cases)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        steps = data.get("solution_steps")
        outcomes = data.get("outcomes")
        weak, strong = data.get("weak_correct"), data.get("strong_correct")
        if isinstance(outcomes, dict):
            weak, strong = _flag(outcomes, WEAK_COLUMN), _flag(outcomes, STRONG_COLUMN)
        prompt = data.get("prompt")
        if prompt is None:  # the obvious cases: a conversation; the model reads the last user turn
            users = [m["content"] for m in data["messages"] if m.get("role") == "user"]
            prompt = users[-1] if users else ""
        return cls(
            id=str(data["id"]),
            source=str(data.get("source", "obvious_cases")),
            prompt=str(prompt),
            category=data.get("category"),
            weak_correct=weak,
            strong_correct=strong,
            solution_steps=None if steps is None else int(steps),
            difficulty=data.get("label"),
            split=data.get("split"),
        )


def _flag(outcomes: dict[str, Any], column: str) -> bool | None:
    value = outcomes.get(column)
    return None if value is None else bool(value)


def _read_lines(path: Path) -> Iterator[str]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            yield from handle
    else:
        with path.open(encoding="utf-8") as handle:
            yield from handle


def load_rows(data_dir: Path, files: Iterable[str] = DATA_FILES) -> list[Row]:
    """Every row of ``files`` under ``data_dir``, in file order then line order; rows of an
    outcome file carry their IRT gain (``irt_gains``)."""
    rows: list[Row] = []
    for name in files:
        path = data_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"training data file missing: {path}")
        records = [json.loads(line) for line in _read_lines(path) if line.strip()]
        loaded = [Row.from_json(record) for record in records]
        if name in OUTCOME_FILES and loaded:
            gains = irt_gains(records, floor=IRT_FLOOR.get(loaded[0].source, 0.0))
            loaded = [replace(row, gain=g) for row, g in zip(loaded, gains, strict=True)]
        rows.extend(loaded)
    return rows


def irt_gains(records: list[dict[str, Any]], *, floor: float) -> list[float]:
    """P(70B right) - P(8B right), at least 0, per question of one outcome file (2PL fit)."""
    columns = sorted({c for record in records for c in record["outcomes"]})
    index = {c: i for i, c in enumerate(columns)}
    correct = np.zeros((len(records), len(columns)))
    observed = np.zeros_like(correct)
    for i, record in enumerate(records):
        for column, value in record["outcomes"].items():
            correct[i, index[column]] = value
            observed[i, index[column]] = 1
    fit = fit_2pl(correct, observed, floor=floor)
    gain = fit.p_correct(index[STRONG_COLUMN]) - fit.p_correct(index[WEAK_COLUMN])
    return [round(float(g), 6) for g in np.maximum(gain, 0.0)]


def question_stem(prompt: str) -> str:
    """The question without its multiple-choice options."""
    match = _FIRST_OPTION.search(prompt)
    return prompt[: match.start()] if match else prompt


def group_key(prompt: str) -> str:
    """Normalised question text (lower case, word characters only), cut to the group prefix."""
    normalised = _NON_WORD.sub(" ", question_stem(prompt).lower()).strip()
    return normalised[:GROUP_PREFIX_CHARS]


def row_group(row: Row) -> str:
    """The group a row is split by: its ``group_key``, or its id for the ZeroEval files (each
    CRUXEval prompt opens with the same 200-character instruction; none repeats a question)."""
    if row.source.startswith("zeroeval_"):
        return row.id
    return group_key(row.prompt)


def is_validation(key: str, *, seed: int, fraction: float) -> bool:
    """Stable split by group: a keyed hash of the group, independent of row order and process."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction
