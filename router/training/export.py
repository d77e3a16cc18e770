"""Writing the serving export of a skops model file (``router.serving_export``).

``export_model_file(model_path)`` loads the skops file with scikit-learn (types and version
checked), takes each expert's hashed scorer verified against its pipeline, scores the probe
texts with each pipeline itself (``predict_proba``) and writes ``<model>.serving.json`` beside
it. Training calls it after saving the model; ``tiergate train --export-only`` calls it for an
existing file. It refuses to write an export that does not reproduce a pipeline within 1e-9.
"""

from __future__ import annotations

from pathlib import Path

import sklearn

from router.classifier import HashedExpert, model_text
from router.features import PromptFeatures
from router.model_file import load_classifier
from router.serving_export import (
    PROBE_TOLERANCE,
    ServingExportError,
    encode_serving_export,
    serving_export_path,
    write_serving_export,
)

__all__ = ["PROBE_PROMPTS", "PROBE_TEXTS", "export_model_file", "probe_texts"]

PROBE_PROMPTS = (
    "",
    " \n\t ",
    "What is the capital of France?",
    "Write a haiku about spring",
    "Prove that there are infinitely many primes p such that p ≡ 3 (mod 4).",
    "Which gas makes up most of Earth's atmosphere?\nA. Oxygen\nB. Nitrogen\nC. Argon\nD. CO2",
    "A car travels 120 km in 1.5 h. What is its mean speed in m/s?\n(A) 22.2 (B) 80 (C) 33.3",
    "Review this Go code for a race:\n```go\nfunc (c *Cache) Get(k string) string {\n"
    "  c.mu.RLock()\n  v := c.m[k]\n  c.mu.RUnlock()\n  return v\n}\n```",
    "Solve $\\int_0^1 x^2 \\, dx$ and explain each step.",
    "请证明:对于所有正整数 n, n^3 - n 能被 6 整除。",
    "Объясните, как работает сборщик мусора в Java.",
    "ما هي عاصمة فرنسا؟",
    "🙂🔥💯 " * 20,
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG. WHY?",
    "tgmlen9 tgmcode TGMopts4 tgmmath and again tgmlatin tgmcjk",
    "Explain this log line. " * 400,
    bytes(range(256)).decode("latin-1"),
    "\x00" * 50 + "null bytes",
)
"""Prompts whose model texts are probes: plain, multiple-choice, code, maths, other scripts,
structural tokens typed by the user (the meta branch then reads the whole text), clipped."""

PROBE_TEXTS = (
    "",
    "tgmlen0 tgmnocode tgmnomath tgmopts0 tgmlatin\nWhat is the capital of France?",
    "tgmlen3 tgmcode tgmmath tgmopts4 tgmcjk\n证明 x^2 ≥ 0; def f(a, b): return a == b\nA. 1\nB. 2",
    "no structural line at all, just words words words",
    "first line\nsecond line with tgmlen5 tgmup3\nthird",
)
"""Raw model texts as probes (not made by ``model_text``): odd shapes the pipeline must agree
on all the same."""


def probe_texts() -> list[str]:
    """The model texts an export records the pipeline's scores on."""
    return [model_text(PromptFeatures.from_text(p)) for p in PROBE_PROMPTS] + list(PROBE_TEXTS)


def export_model_file(model_path: Path) -> Path:
    """Write the serving export of the skops file ``model_path`` beside it; return its path.

    Raises ``ModelFileError`` if the file cannot be loaded, ``ServingExportError`` if its
    pipeline cannot be served by the hashed scorer.
    """
    classifier = load_classifier(model_path)
    texts = probe_texts()
    experts: dict[str, HashedExpert] = {}
    probes: list[tuple[str, str, float, float]] = []
    for name, expert in classifier.experts.items():
        scorer = expert.scorer
        if scorer is None:
            raise ServingExportError(
                f"{model_path}: the {name} pipeline has a shape the hashed scorer does not "
                "reproduce; it can only be served from the skops file"
            )
        reference = expert.probabilities(texts)
        for text, expected in zip(texts, reference, strict=True):
            if not abs(scorer(text) - expected) <= PROBE_TOLERANCE:
                raise ServingExportError(
                    f"{model_path}: the {name} hashed scorer disagrees on {text!r}"
                )
        experts[name] = HashedExpert(scorer, expert.output)
        probes.extend(
            (name, text, p, expert.output(p)) for text, p in zip(texts, reference, strict=True)
        )
    content = encode_serving_export(
        experts,
        metadata=classifier.metadata,
        source=model_path,
        sklearn_version=sklearn.__version__,
        probes=probes,
    )
    target = serving_export_path(model_path)
    write_serving_export(target, content)
    return target
