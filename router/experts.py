"""Experts: the gate that picks a model per request, and the models' output maps.

A model file names two experts, ``multiple_choice`` (a last user message with options ``A.``,
``B.``, … — at least two) and ``open`` (everything else), and the gate below picks one per
request from that fact. Up to model text v3 they were two models (one learnt from MMLU-Pro
outcomes, one from weak labels); since v4 one model, trained on every source on one scale
(the large model's expected gain), serves both names: one model ranked every kind better than
two whose scales met only through the share curve (docs/classifier.md). The structure stays so
that a file may again hold two.

``Output`` maps an expert's fitted probability p to its score: ``offset + scale * p``, clamped
to [0, 1] (``PROBABILITY``: p itself; ``GAIN``: 2p - 1, for a model trained on
(gain + 1) / 2, as v3's multiple-choice expert was).

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
