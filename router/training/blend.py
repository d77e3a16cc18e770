"""The monotone blend with prompt length: a slope per kind of prompt on its log length.

The model text carries a length *thermometer* per kind (``router.classifier.meta_tokens``:
``tgm<kind>tick1`` … ``tgm<kind>tick<steps>``, one step per quarter doubling of the body), so adding
``slope`` to the weight of each of a kind's steps adds ``slope · steps`` to that kind's logit:
a monotone function of the length, added to the learnt score, inside the fitted pipeline
itself (so the serving export still reproduces the skops file exactly). Where the learnt
score cannot beat prompt length on a family (``bench/classifier_families.py``), the kind that
family's prompts fall into gets a slope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from router.classifier import META_PREFIX, max_steps

__all__ = ["KINDS", "LengthSlopeError", "apply_length_slopes", "step_tokens"]

KINDS = ("mc", "code", "math", "txt")


class LengthSlopeError(ValueError):
    """A length step shares its hashed index with another token: the slope would leak."""


def step_tokens(kind: str) -> list[str]:
    return [f"{META_PREFIX}{kind}tick{i}" for i in range(1, max_steps(kind) + 1)]


def apply_length_slopes(
    pipeline: Any, slopes: Mapping[str, float], vocabulary: Iterable[str]
) -> None:
    """Add ``slopes[kind]`` to the fitted weight of each of ``kind``'s length steps.

    ``vocabulary``: every structural token the training texts hold; a step whose hashed index
    another token shares is refused (``LengthSlopeError``).
    """
    union = pipeline.named_steps["features"]
    model = pipeline.named_steps["model"]
    offset = 0
    meta = None
    for name, vectorizer in union.transformer_list:
        if name == "meta":
            meta = vectorizer
            break
        offset += vectorizer.n_features
    if meta is None:
        raise ValueError("the pipeline has no meta branch")
    steps = {t for kind in KINDS for t in step_tokens(kind)}
    others = set(vocabulary) - steps
    taken = {int(meta.transform([t]).indices[0]) for t in others}
    step_indices = [int(meta.transform([t]).indices[0]) for t in sorted(steps)]
    if len(set(step_indices)) != len(step_indices):
        raise LengthSlopeError("two length steps share a hashed index")
    for kind, slope in slopes.items():
        if slope == 0:
            continue
        for token in step_tokens(kind):
            index = int(meta.transform([token]).indices[0])
            if index in taken:
                raise LengthSlopeError(f"{token} shares its index with another token")
            model.coef_[0, offset + index] += slope
