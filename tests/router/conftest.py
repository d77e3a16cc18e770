from __future__ import annotations

from pathlib import Path

import pytest

from router.classifier import model_text
from router.experts import GAIN, MULTIPLE_CHOICE, OPEN, PROBABILITY
from router.features import PromptFeatures
from router.sklearn_classifier import SklearnClassifier, SklearnExpert
from router.training.pipeline import PipelineConfig, build_pipeline

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO / "data" / "routing"

EASY = [
    "What is the capital of France?",
    "Write a haiku about spring",
    "Translate 'good morning' into Spanish.",
    "Give me three name ideas for a bakery.",
    "List five fruits that are red.",
]
HARD = [
    "Prove that there are infinitely many primes p such that p ≡ 3 (mod 4). Proceed step by step.",
    "Review this Go code for a concurrency bug and explain the race precisely:\n"
    "```go\nfunc (c *Cache) Get(k string) string {\n  c.mu.RLock()\n  v, ok := c.m[k]\n"
    "  c.mu.RUnlock()\n  if !ok {\n    c.mu.Lock()\n    v = load(k)\n    c.m[k] = v\n"
    "    c.mu.Unlock()\n  }\n  return v\n}\n```",
    "Explain why this Python asyncio code deadlocks under load and rewrite it correctly:\n"
    "```python\nasync def worker(q, lock):\n    async with lock:\n        item = await q.get()\n"
    "        await process(item)\n```",
    "Compare the time complexity of Dijkstra with a Fibonacci heap versus a binary heap, and "
    "prove the amortized bound for decrease-key.",
    "Write a formal proof in Lean 4 that the sum of the first n odd numbers is n^2.",
]


MC_EASY = [
    "Which gas makes up most of Earth's atmosphere?\nA. Oxygen\nB. Nitrogen\nC. Argon",
    "What colour is the sky on a clear day?\nA. Blue\nB. Green",
    "How many legs does a spider have?\nA. 6\nB. 8\nC. 10\nD. 12",
]
MC_HARD = [
    "A 2.0 kg block slides 3.5 m down a 30° incline with μ = 0.2. What is its speed at the "
    "bottom?\nA. 3.1 m/s\nB. 4.2 m/s\nC. 5.0 m/s\nD. 5.9 m/s\nE. 6.3 m/s\nF. 7.0 m/s",
    "Under the UCC, which of the following best describes a merchant's firm offer?\n"
    "A. An offer that is irrevocable without consideration for up to three months\n"
    "B. An offer that must be signed by both parties\nC. An oral promise to hold an offer open\n"
    "D. An offer that may be revoked at any time before acceptance",
]


def fit_tiny_pipeline(config: PipelineConfig, prompts: list[str], labels: list[int]) -> object:
    pipeline = build_pipeline(config)
    pipeline.fit([model_text(PromptFeatures.from_text(t)) for t in prompts], labels)
    return pipeline


@pytest.fixture(scope="session")
def tiny_classifier() -> SklearnClassifier:
    """Small experts fitted on a few prompts: fast, and the same shape as the real ones."""
    open_pipeline = fit_tiny_pipeline(
        PipelineConfig(word_features=2**12, meta_features=2**6),
        EASY + HARD,
        [0] * len(EASY) + [1] * len(HARD),
    )
    mc_pipeline = fit_tiny_pipeline(
        PipelineConfig(meta_features=2**6, words=False),
        MC_EASY + MC_HARD,
        [0] * len(MC_EASY) + [1] * len(MC_HARD),
    )
    experts = {
        OPEN: SklearnExpert(open_pipeline, PROBABILITY),
        MULTIPLE_CHOICE: SklearnExpert(mc_pipeline, GAIN),
    }
    return SklearnClassifier(experts, metadata={"threshold": 0.5, "seed": 7})
