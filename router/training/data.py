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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_FILES",
    "GROUP_PREFIX_CHARS",
    "Row",
    "group_key",
    "is_validation",
    "load_rows",
    "question_stem",
]

DATA_FILES = (
    "mmlu_pro_llama31_train.jsonl.gz",
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        steps = data.get("solution_steps")
        return cls(
            id=str(data["id"]),
            source=str(data["source"]),
            prompt=str(data["prompt"]),
            category=data.get("category"),
            weak_correct=data.get("weak_correct"),
            strong_correct=data.get("strong_correct"),
            solution_steps=None if steps is None else int(steps),
        )


def _read_lines(path: Path) -> Iterator[str]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            yield from handle
    else:
        with path.open(encoding="utf-8") as handle:
            yield from handle


def load_rows(data_dir: Path, files: Iterable[str] = DATA_FILES) -> list[Row]:
    """Every row of ``files`` under ``data_dir``, in file order then line order."""
    rows: list[Row] = []
    for name in files:
        path = data_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"training data file missing: {path}")
        rows.extend(Row.from_json(json.loads(line)) for line in _read_lines(path) if line.strip())
    return rows


def question_stem(prompt: str) -> str:
    """The question without its multiple-choice options."""
    match = _FIRST_OPTION.search(prompt)
    return prompt[: match.start()] if match else prompt


def group_key(prompt: str) -> str:
    """Normalised question text (lower case, word characters only), cut to the group prefix."""
    normalised = _NON_WORD.sub(" ", question_stem(prompt).lower()).strip()
    return normalised[:GROUP_PREFIX_CHARS]


def is_validation(key: str, *, seed: int, fraction: float) -> bool:
    """Stable split by group: a keyed hash of the group, independent of row order and process."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction
