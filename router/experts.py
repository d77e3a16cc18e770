"""Experts: one linear model per kind of prompt, and the gate that picks one per request.

The classifier is two models over the same model text (``router.classifier.model_text``):

* ``multiple_choice``, for a last user message with options ``A.``, ``B.``, … (at least two):
  learnt from real outcomes (MMLU-Pro, Llama-3.1-8B against 70B), it reads only the structural
  and question-shape tokens and estimates the expected gain of the large model,
  E[strong - weak];
* ``open``, for everything else: learnt from weak labels (everyday instructions, arena-hard,
  GSM8K by solution steps), it reads the words and the tokens and estimates the chance that
  the large model is needed.

One model for both did worse at each (docs/classifier.md, round 4): words that help to tell an
arena-hard prompt from an everyday one are noise on exam questions, and training it harder on
one kind cost the other. The gate is a fact about the prompt, not a learnt guess: 3 of 1,398
chat prompts and no GSM8K problem have options; 2.6 % of MMLU-Pro questions are not found to.

Both experts' scores are on the scale of a quality gain in [0, 1], so one threshold and one
share curve serve a mix of both kinds. ``Output`` maps an expert's fitted probability p to its
score: ``offset + scale * p``, clamped to [0, 1] (for the multiple-choice expert, trained on the
label (gain + 1) / 2, that is 2p - 1; for the open one, p itself).

Pure: no I/O, no state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from router.features import PromptFeatures

__all__ = [
    "EXPERTS",
    "GAIN",
    "MULTIPLE_CHOICE",
    "OPEN",
    "PROBABILITY",
    "Output",
    "expert_for",
    "missing_experts",
]

MULTIPLE_CHOICE = "multiple_choice"
OPEN = "open"
EXPERTS = (MULTIPLE_CHOICE, OPEN)


def expert_for(features: PromptFeatures) -> str:
    """The expert that scores a prompt: ``multiple_choice`` when it has options, else ``open``."""
    return MULTIPLE_CHOICE if features.has_options else OPEN


def missing_experts(names: Iterable[str]) -> str | None:
    """The experts ``names`` lacks, as an error message (``"no expert …"``), or ``None``."""
    missing = set(EXPERTS) - set(names)
    return f"no expert {', '.join(sorted(missing))}" if missing else None


@dataclass(frozen=True, slots=True)
class Output:
    """An expert's fitted probability p → its score: ``offset + scale * p`` in [0, 1]."""

    scale: float = 1.0
    offset: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and math.isfinite(self.offset)) or self.scale <= 0:
            raise ValueError(f"bad output map: scale {self.scale!r}, offset {self.offset!r}")

    def __call__(self, p: float) -> float:
        return min(1.0, max(0.0, self.offset + self.scale * p))


GAIN = Output(scale=2.0, offset=-1.0)
"""The multiple-choice expert's map: P((gain + 1) / 2) → E[gain]."""
PROBABILITY = Output()
"""The open expert's map: the probability itself."""
