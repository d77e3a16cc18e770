from __future__ import annotations

from pathlib import Path

import pytest

from router.classifier import SklearnClassifier, model_text
from router.features import PromptFeatures
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


@pytest.fixture(scope="session")
def tiny_classifier() -> SklearnClassifier:
    """A small pipeline fitted on a few prompts: fast, and the same shape as the real one."""
    pipeline = build_pipeline(PipelineConfig(word_features=2**12, meta_features=2**6))
    texts = [model_text(PromptFeatures.from_text(t)) for t in EASY + HARD]
    pipeline.fit(texts, [0] * len(EASY) + [1] * len(HARD))
    return SklearnClassifier(pipeline, metadata={"threshold": 0.5, "seed": 7})
