"""Labels: what the model learns from each row, and how much the row counts.

One model is fitted on every kind of prompt, on one scale: the expected quality gain of the
large model over the small one, E[70B right - 8B right], in [0, 1]. The two experts of the model
file (``router.experts``) share it (a row's expert is kept only as a field).

**Outcome data: the IRT gain.** For MMLU-Pro (29 models), MATH level 5 (40) and CRUXEval (48),
a two-parameter item-response model fitted to each file's outcome matrix
(``router.training.irt``) gives each question a difficulty and a discrimination and each model
an ability; the label is P(70B right) - P(8B right) (at least 0): many models' outcomes instead
of one noisy 8B / 70B draw, and the hump the pool's README shows (the 70B model helps most at
middle difficulty, not where both fail) is in it. On grouped CV it ranked the real 8B / 70B
flags better than the raw 3-valued gain or a difficulty score (docs/classifier.md).

**Weak labels**, on the same scale:

==========================  =====================================  ==========
rows                        target p                               weight w
==========================  =====================================  ==========
MMLU-Pro, MATH, CRUXEval    IRT gain (mean 0.17 / 0.22 / 0.25)     1
MMLU-Pro format variants    the question's IRT gain                0.5
everyday instructions       0 ("easy" by intent)                   3
arena-hard (v0.1, v2.0      0.5 (selected as hard)                 1
  coding and maths)
arena-hard v2.0 creative    0.3                                    1
GSM8K                       0.03 + 0.05 · (steps - 2), ≤ 0.4       2
obvious cases (train)       easy 0, hard 0.6                       5
==========================  =====================================  ==========

A soft label p with weight w becomes two rows, (1, w·p) and (0, w·(1-p)). The obvious cases'
holdout half is never trained on (its test is ``tests/router/test_obvious_cases.py``).

**Format variants** (``format_variants``): each MMLU-Pro training question is also rendered as
four of its options written ``(A)`` or ``A)``, with and without an ``Answer:`` line, with the
same label, so that the number of options and their dress cannot stand in for difficulty.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from router.experts import MULTIPLE_CHOICE, OPEN
from router.training.data import Row

__all__ = [
    "ARENA_HARD_SOURCES",
    "EVERYDAY_SOURCES",
    "OBVIOUS_SOURCE",
    "OUTCOME_SOURCES",
    "LabelScheme",
    "Target",
    "expert_targets",
    "format_variants",
    "needs_large",
    "targets",
    "training_targets",
]

EVERYDAY_SOURCES = frozenset(
    {"self_instruct_seed_tasks", "self_instruct_user_oriented", "vicuna_bench"}
)
ARENA_HARD_SOURCES = frozenset({"arena_hard_v0.1", "arena_hard_v2.0"})


OUTCOME_SOURCES = frozenset({"mmlu_pro", "zeroeval_math_l5", "zeroeval_crux"})
OBVIOUS_SOURCE = "obvious_cases"


@dataclass(frozen=True, slots=True)
class LabelScheme:
    """The numbers of the table above; a field per choice so experiments can vary them."""

    outcome_weight: float = 1.0
    variant_weight: float = 0.5
    everyday_weight: float = 3.0
    arena_hard_p: float = 0.5
    arena_creative_p: float = 0.3
    arena_hard_weight: float = 1.0
    gsm8k_base_p: float = 0.03
    gsm8k_step_p: float = 0.05
    gsm8k_max_p: float = 0.4
    gsm8k_weight: float = 2.0
    obvious_hard_p: float = 0.6
    obvious_weight: float = 5.0
    variants: bool = True


@dataclass(frozen=True, slots=True)
class Target:
    """A row's soft label ``p``, its weight, and the expert that learns from it."""

    row: Row
    p: float
    weight: float
    expert: str


def needs_large(row: Row) -> bool | None:
    """The strict target for a row with real outcomes (None when the row has none)."""
    if row.weak_correct is None or row.strong_correct is None:
        return None
    return bool(row.strong_correct and not row.weak_correct)


def _target(row: Row, scheme: LabelScheme) -> Target | None:
    if row.source in OUTCOME_SOURCES:
        if row.gain is None:
            return None
        return Target(row, row.gain, scheme.outcome_weight, OPEN)
    if row.source == OBVIOUS_SOURCE:
        if row.split != "train" or row.difficulty not in ("easy", "hard"):
            return None
        p = scheme.obvious_hard_p if row.difficulty == "hard" else 0.0
        return Target(row, p, scheme.obvious_weight, OPEN)
    if row.source in EVERYDAY_SOURCES:
        return Target(row, 0.0, scheme.everyday_weight, OPEN)
    if row.source in ARENA_HARD_SOURCES:
        creative = row.category == "creative_writing"
        p = scheme.arena_creative_p if creative else scheme.arena_hard_p
        return Target(row, p, scheme.arena_hard_weight, OPEN)
    if row.source == "gsm8k_train" and row.solution_steps is not None:
        p = scheme.gsm8k_base_p + scheme.gsm8k_step_p * (row.solution_steps - 2)
        return Target(row, min(scheme.gsm8k_max_p, max(0.0, p)), scheme.gsm8k_weight, OPEN)
    return None


def targets(rows: Iterable[Row], scheme: LabelScheme) -> list[Target]:
    """Targets for the rows the scheme labels (others are skipped), in row order."""
    return [t for t in (_target(row, scheme) for row in rows) if t is not None]


_OPTION_LINE = re.compile(r"^([A-J])\. (.*)$")


def format_variants(row: Row) -> list[Row]:
    """Other dresses of a multiple-choice question (``A. …`` lines): four of its options
    (chosen by a hash of its id) written ``(A)`` or ``A)``, with or without ``Answer:``."""
    lines = row.prompt.split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith("A. ")), None)
    if first is None:
        return []
    options = [m.group(2) for line in lines[first:] if (m := _OPTION_LINE.match(line))]
    if len(options) < 4:
        return []
    digest = hashlib.blake2b(row.id.encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    chosen = sorted(rng.sample(range(len(options)), 4))
    stem = "\n".join(lines[:first])
    style = ("({}) {}", "{}) {}")[rng.randrange(2)]
    suffix = ("", "\nAnswer:")[rng.randrange(2)]
    text = "\n".join(style.format("ABCD"[j], options[i]) for j, i in enumerate(chosen))
    return [replace(row, id=f"{row.id}~4", prompt=f"{stem}\n{text}{suffix}")]


def training_targets(rows: Iterable[Row], scheme: LabelScheme) -> list[Target]:
    """``targets`` and, for multiple-choice outcome rows, their format variants."""
    out: list[Target] = []
    for target in targets(rows, scheme):
        out.append(target)
        if scheme.variants and target.row.source == "mmlu_pro":
            weight = scheme.variant_weight
            out.extend(Target(v, target.p, weight, OPEN) for v in format_variants(target.row))
    return out


def expert_targets(rows: Iterable[Row], scheme: LabelScheme) -> dict[str, list[Target]]:
    """``targets`` by the expert that learns from them, in row order within each."""
    by_expert: dict[str, list[Target]] = {MULTIPLE_CHOICE: [], OPEN: []}
    for target in targets(rows, scheme):
        by_expert[target.expert].append(target)
    return by_expert
