"""Labels: what each expert learns from each row, and how much the row counts.

The model has two experts (``router.experts``): one for multiple-choice questions, learnt from
the only real outcomes we have (MMLU-Pro, Llama-3.1-8B against 70B), and one for every other
prompt, learnt from *weak* labels: a prior written down here, with a weight that says how much
a row counts. A soft label p with weight w becomes two training rows, (1, w·p) and (0, w·(1-p));
a logistic regression trained on them minimises the cross-entropy against p.

**Multiple-choice expert: the expected gain.** Routing by APGR asks for prompts ranked by the
expected quality gain of the large model, E[strong - weak], where strong and weak are the 70B and
8B outcomes (1 right, 0 wrong). The label is p = (strong - weak + 1) / 2: 1 when only 70B is
right, 0 when only 8B is, 0.5 when both are right or both wrong (the large model changes
nothing). The fitted probability is then (E[gain] + 1) / 2, and the expert's score is
2p - 1 = E[gain], clamped to [0, 1] (``router.experts.Output``). Every MMLU-Pro row counts,
both-wrong rows included: their gain is 0, like both-correct rows.

**Open expert: weak labels**, on the scale of a gain too: the chance that the large model is
needed.

==========================  =====================================  ==========  ======
rows                        target p                               weight w    count
==========================  =====================================  ==========  ======
MMLU-Pro (multiple choice)  (strong - weak + 1) / 2                1           9,572
everyday instructions       0 ("easy" by intent)                   5             502
arena-hard (v0.1, v2.0      0.7 (selected as hard, not measured)   2             997
  coding and maths)
arena-hard v2.0 creative    0.5                                    2             250
GSM8K                       0.05 + 0.08 · (steps - 2), ≤ 0.7       2           7,473
==========================  =====================================  ==========  ======

The weights of the open expert were set by development runs, looking at everyday-vs-hard AUC,
the GSM8K ranking by solution steps and a handful of hand-written prompts; they are judgement,
not a fitted optimum. GSM8K counts 2 a row (0.2 when one model served every kind: there it
pulled shared word weights away from MMLU-Pro; an expert of its own has nothing to pull).
The weak labels teach the style of their collections as well as their difficulty (words such as
"write" or "python" lean large because arena-hard asks for code so often); more and better
labelled traffic is the cure, not more weight.

GSM8K: published scores for Llama-3.1 (8-shot CoT) are about 84 % (8B) and 95 % (70B), so the
large model is needed for roughly one problem in nine, more often on long chains. The step
formula gives 0.05 at two steps and 0.61 at nine (mean 0.18 over the file).

Which expert learns from a row goes by its source (outcomes or weak labels), not by the gate:
the 2.6 % of MMLU-Pro prompts whose options the gate does not find still teach the
multiple-choice expert, and are scored by the open one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.experts import MULTIPLE_CHOICE, OPEN
from router.training.data import Row

__all__ = [
    "ARENA_HARD_SOURCES",
    "EVERYDAY_SOURCES",
    "LabelScheme",
    "Target",
    "expert_targets",
    "needs_large",
    "targets",
]

EVERYDAY_SOURCES = frozenset(
    {"self_instruct_seed_tasks", "self_instruct_user_oriented", "vicuna_bench"}
)
ARENA_HARD_SOURCES = frozenset({"arena_hard_v0.1", "arena_hard_v2.0"})


@dataclass(frozen=True, slots=True)
class LabelScheme:
    """The numbers of the table above; a field per choice so experiments can vary them."""

    mmlu_weight: float = 1.0
    everyday_weight: float = 5.0
    arena_hard_p: float = 0.7
    arena_creative_p: float = 0.5
    arena_hard_weight: float = 2.0
    gsm8k_base_p: float = 0.05
    gsm8k_step_p: float = 0.08
    gsm8k_max_p: float = 0.7
    gsm8k_weight: float = 2.0


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
    if row.source == "mmlu_pro":
        if row.weak_correct is None or row.strong_correct is None:
            return None
        gain = int(row.strong_correct) - int(row.weak_correct)
        return Target(row, (gain + 1) / 2, scheme.mmlu_weight, MULTIPLE_CHOICE)
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


def expert_targets(rows: Iterable[Row], scheme: LabelScheme) -> dict[str, list[Target]]:
    """``targets`` by the expert that learns from them, in row order within each."""
    by_expert: dict[str, list[Target]] = {MULTIPLE_CHOICE: [], OPEN: []}
    for target in targets(rows, scheme):
        by_expert[target.expert].append(target)
    return by_expert
