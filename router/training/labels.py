"""Labels: which prompts need the large model, and how much each row should count.

The target is the routing question itself: P(the 8B answer is not good enough while the 70B
answer is). Only MMLU-Pro has real outcomes for both models; the other collections carry
*weak* labels, a prior probability written down here, with a weight that says how much a row
counts next to one real outcome.

A soft label p with weight w becomes two training rows, (1, w·p) and (0, w·(1 - p)); a logistic
regression trained on them minimises the cross-entropy against p.

==========================  =====================================  ==========  ======
rows                        target p (needs large)                 weight w    count
==========================  =====================================  ==========  ======
MMLU-Pro, only 70B correct  1                                      0.5         2,410
MMLU-Pro, both correct      0                                      0.5         3,614
MMLU-Pro, only 8B correct   0 (the 70B model does not help)        0.5           652
MMLU-Pro, both wrong        see ``both_wrong`` (default: dropped)  —           2,896
everyday instructions       0 ("easy" by intent)                   5             502
arena-hard (v0.1, v2.0      0.7 (selected as hard, not measured)   2             997
  coding and maths)
arena-hard v2.0 creative    0.5                                    2             250
GSM8K                       0.05 + 0.08 · (steps - 2), ≤ 0.7       0.2         7,473
==========================  =====================================  ==========  ======

In total weight the real outcomes (≈ 3,300) and the weak labels (≈ 2,500 everyday, 2,500
arena-hard, 1,500 GSM8K) are of the same order. The weights were set by a few development runs
on other split seeds than the shipped model's, looking at MMLU-Pro AUC, everyday-vs-hard AUC
and a handful of hand-written prompts; they are judgement, not a fitted optimum. The weak
labels teach the style of their collections as well as their difficulty (words such as
"write" or "python" lean large because arena-hard asks for code so often); more and better
labelled traffic is the cure, not more weight.

Why both-wrong rows are dropped by default: labelling them 0 teaches that the hardest questions
belong on the small model, the opposite of what every other source says, while labelling them 1
claims a benefit the outcomes do not show. Each flag is one noisy draw (up to ten options, one
run per model), so these rows mostly carry noise about the target. They stay in the validation
metrics, which use every MMLU-Pro row with the strict target.

Tried and not kept (see docs/classifier.md): labelling both-wrong rows 0 — APGR counts their
gain strong - weak as 0, like both-correct rows — with the MMLU-Pro weight raised to 2. On two
inner development splits of the training rows it raised MMLU-Pro APGR (0.514 → 0.546 and
0.514 → 0.522, within noise); on the validation split it did not (0.527 → 0.527) and lost
elsewhere (MMLU-Pro AUC 0.550 → 0.530, everyday-vs-hard AUC 0.923 → 0.887), so the
incumbent stayed. ``LabelScheme(both_wrong=BothWrong.ZERO, both_wrong_weight=1.0,
mmlu_weight=2.0)`` reproduces it.

GSM8K: published scores for Llama-3.1 (8-shot CoT) are about 84 % (8B) and 95 % (70B), so the
large model is needed for roughly one problem in nine, more often on long chains. The step
formula gives 0.05 at two steps and 0.61 at nine (mean 0.18 over the file).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from router.training.data import Row

__all__ = [
    "ARENA_HARD_SOURCES",
    "EVERYDAY_SOURCES",
    "BothWrong",
    "LabelScheme",
    "Target",
    "needs_large",
    "targets",
]

EVERYDAY_SOURCES = frozenset(
    {"self_instruct_seed_tasks", "self_instruct_user_oriented", "vicuna_bench"}
)
ARENA_HARD_SOURCES = frozenset({"arena_hard_v0.1", "arena_hard_v2.0"})


class BothWrong(StrEnum):
    DROP = "drop"
    ZERO = "zero"


@dataclass(frozen=True, slots=True)
class LabelScheme:
    """The numbers of the table above; a field per choice so experiments can vary them."""

    both_wrong: BothWrong = BothWrong.DROP
    both_wrong_weight: float = 0.5
    """Multiplies ``mmlu_weight`` for both-wrong rows (with ``BothWrong.ZERO``)."""
    mmlu_weight: float = 0.5
    everyday_weight: float = 5.0
    arena_hard_p: float = 0.7
    arena_creative_p: float = 0.5
    arena_hard_weight: float = 2.0
    gsm8k_base_p: float = 0.05
    gsm8k_step_p: float = 0.08
    gsm8k_max_p: float = 0.7
    gsm8k_weight: float = 0.2


@dataclass(frozen=True, slots=True)
class Target:
    """A row's soft label ``p`` and its weight."""

    row: Row
    p: float
    weight: float


def needs_large(row: Row) -> bool | None:
    """The strict target for a row with real outcomes (None when the row has none)."""
    if row.weak_correct is None or row.strong_correct is None:
        return None
    return bool(row.strong_correct and not row.weak_correct)


def _target(row: Row, scheme: LabelScheme) -> Target | None:
    if row.source == "mmlu_pro":
        if not row.weak_correct and not row.strong_correct:
            if scheme.both_wrong is BothWrong.DROP:
                return None
            return Target(row, 0.0, scheme.both_wrong_weight * scheme.mmlu_weight)
        return Target(row, 1.0 if needs_large(row) else 0.0, scheme.mmlu_weight)
    if row.source in EVERYDAY_SOURCES:
        return Target(row, 0.0, scheme.everyday_weight)
    if row.source in ARENA_HARD_SOURCES:
        creative = row.category == "creative_writing"
        p = scheme.arena_creative_p if creative else scheme.arena_hard_p
        return Target(row, p, scheme.arena_hard_weight)
    if row.source == "gsm8k_train" and row.solution_steps is not None:
        p = scheme.gsm8k_base_p + scheme.gsm8k_step_p * (row.solution_steps - 2)
        return Target(row, min(scheme.gsm8k_max_p, max(0.0, p)), scheme.gsm8k_weight)
    return None


def targets(rows: Iterable[Row], scheme: LabelScheme) -> list[Target]:
    """Targets for the rows the scheme labels (others are skipped), in row order."""
    return [t for t in (_target(row, scheme) for row in rows) if t is not None]
