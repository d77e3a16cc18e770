"""Look at the prompts: the shipped model's score and tier for the issue's seven prompts and
for ~40 more across kinds, as ``tiergate classify`` would give them.

    .venv/bin/python bench/classifier_prompts.py [--model path.skops] [--markdown]

writes ``bench/results/classifier_prompts.json`` (prompt, kind, expected tier, score, tier).
Judge them as a person would; a metric on a validation split did not catch the last model's
failures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.features import Message, PromptFeatures  # noqa: E402
from router.loader import load_serving_classifier  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "classifier_prompts.json"

_LONG_TEXT = (
    "The city council met on Tuesday to discuss the new budget. Members debated the cost of "
    "repairing the old bridge, the schedule for the library renovation and whether to extend "
    "the opening hours of the public pool during the summer. After a long discussion they "
    "agreed to postpone the vote on the bridge until an engineering report is available, "
    "approved the library plan, and asked staff to survey residents about the pool. "
) * 6


def _user(text: str) -> list[Message]:
    return [{"role": "user", "content": text}]


PROMPTS: list[tuple[str, str, list[Message]]] = [
    # (kind, expected tier, messages)
    ("issue", "small", _user("hello")),
    ("issue", "small", _user("ok")),
    ("issue", "small", _user("Hi")),
    ("issue", "small", _user("Write a haiku about autumn.")),
    ("issue", "large", _user("Prove that there are infinitely many primes.")),
    (
        "issue",
        "large",
        _user(
            "Implement a lock-free multi-producer multi-consumer ring buffer in C++ with "
            "memory ordering explained."
        ),
    ),
    (
        "issue",
        "large",
        _user(
            "Explain the proof of the Riemann mapping theorem step by step, including the use "
            "of Montel's theorem."
        ),
    ),
    ("greeting", "small", _user("Good morning!")),
    ("greeting", "small", _user("hey there, how are you doing today?")),
    ("thanks", "small", _user("thanks!")),
    ("thanks", "small", _user("Thank you so much, that was really helpful.")),
    ("small talk", "small", _user("What's your favourite colour?")),
    ("small talk", "small", _user("lol that's funny")),
    ("trivial fact", "small", _user("What is the capital of France?")),
    ("trivial fact", "small", _user("How many days are in a week?")),
    ("trivial fact", "small", _user("Who wrote Romeo and Juliet?")),
    ("conversion", "small", _user("Convert 5 miles to kilometers.")),
    ("conversion", "small", _user("What is 72 degrees Fahrenheit in Celsius?")),
    ("conversion", "small", _user("How many ounces are in a pound?")),
    ("summarise long text", "small", _user(f"Summarize this in two sentences:\n\n{_LONG_TEXT}")),
    ("translate long text", "small", _user(f"Translate into French:\n\n{_LONG_TEXT}")),
    (
        "rewrite long text",
        "small",
        _user(f"{_LONG_TEXT}\n\nFix the grammar and spelling of the text above."),
    ),
    ("simple writing", "small", _user("Write a short birthday message for my aunt.")),
    ("simple writing", "small", _user("Give me three name ideas for a golden retriever puppy.")),
    ("short proof", "large", _user("Prove that the square root of 2 is irrational.")),
    ("short proof", "large", _user("Show that every finite integral domain is a field.")),
    (
        "olympiad maths",
        "large",
        _user(
            "Find all functions f: R -> R such that f(x + y) + f(xy) = f(x)f(y) + 1 for all "
            "real x, y."
        ),
    ),
    (
        "olympiad maths",
        "large",
        _user(
            "Let $a, b, c > 0$ with $abc = 1$. Prove that $\\sum \\frac{a}{b+c} \\geq "
            "\\frac{3}{2}$."
        ),
    ),
    (
        "lock-free code",
        "large",
        _user(
            "Write a lock-free stack in Rust using atomics and explain how you avoid the ABA "
            "problem."
        ),
    ),
    (
        "concurrency bug",
        "large",
        _user(
            "This Go code sometimes deadlocks under load. Find the bug and fix it:\n```go\n"
            "func (q *Queue) Push(v int) {\n  q.mu.Lock()\n  for len(q.items) == q.cap {\n"
            "    q.notFull.Wait()\n  }\n  q.items = append(q.items, v)\n  "
            "q.notEmpty.Signal()\n}\n```"
        ),
    ),
    (
        "system design",
        "large",
        _user(
            "Design a globally distributed rate limiter for an API gateway handling 1M requests "
            "per second. Discuss consistency, failure modes and trade-offs."
        ),
    ),
    (
        "system design",
        "large",
        _user(
            "Design the storage layer of a time-series database optimised for high write "
            "throughput."
        ),
    ),
    (
        "algorithm",
        "large",
        _user(
            "Give an O(n log n) algorithm for counting inversions in an array and prove its "
            "correctness."
        ),
    ),
    (
        "algorithm",
        "large",
        _user(
            "Implement Dijkstra's algorithm with a binary heap in Python and analyse its "
            "complexity."
        ),
    ),
    (
        "hard science",
        "large",
        _user("Derive the Schwarzschild metric from Einstein's field equations."),
    ),
    (
        "4-option (A) with Answer:",
        "small",
        _user(
            "What is the largest planet in the solar system?\n(A) Mars\n(B) Jupiter\n(C) "
            "Venus\n(D) Earth\nAnswer:"
        ),
    ),
    (
        "4-option (A) with Answer:",
        "large",
        _user(
            "Let G be a group of order 56. Which of the following must be true?\n"
            "(A) G has a normal Sylow 7-subgroup or a normal Sylow 2-subgroup\n"
            "(B) G is abelian\n(C) G is cyclic\n(D) G has exactly one subgroup of order 8\nAnswer:"
        ),
    ),
    (
        "chat template",
        "small",
        _user(
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "hi!<|im_end|>\n<|im_start|>assistant\n"
        ),
    ),
    (
        "system prompt + greeting",
        "small",
        [
            {
                "role": "system",
                "content": "You are a senior C++ engineer. Answer precisely, with code.",
            },
            {"role": "user", "content": "hello"},
        ],
    ),
    (
        "multi-turn, thanks",
        "small",
        [
            {"role": "user", "content": "Implement a B-tree in C++ with insertion and deletion."},
            {"role": "assistant", "content": "Here is an implementation: ..."},
            {"role": "user", "content": "great, thanks!"},
        ],
    ),
    (
        "multi-turn, hard follow-up",
        "large",
        [
            {"role": "user", "content": "What is a monad?"},
            {"role": "assistant", "content": "A monad is ..."},
            {
                "role": "user",
                "content": "Prove that the list monad satisfies the three monad laws.",
            },
        ],
    ),
    ("code, easy", "small", _user("How do I print hello world in Python?")),
    ("code, easy", "small", _user("What does `git status` do?")),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    classifier = load_serving_classifier(args.model)
    threshold = classifier.threshold
    assert threshold is not None
    out = []
    for kind, expected, messages in PROMPTS:
        score = classifier.score(PromptFeatures.from_messages(messages))
        tier = "large" if score >= threshold else "small"
        shown = messages[-1]["content"].replace("\n", " ")
        if len(messages) > 1:
            shown = f"[{len(messages)} messages] {shown}"
        out.append(
            {
                "kind": kind,
                "prompt": shown,
                "expected": expected,
                "score": round(score, 3),
                "tier": tier,
            }
        )
    agree = sum(r["expected"] == r["tier"] for r in out)
    if args.markdown:
        print(f"threshold {threshold}; {agree} of {len(out)} as expected\n")
        print("| kind | prompt | score | tier | expected |\n| --- | --- | --- | --- | --- |")
        for r in out:
            p = r["prompt"] if len(r["prompt"]) <= 70 else r["prompt"][:67] + "…"
            p = p.replace("|", "\\|")
            mark = "" if r["expected"] == r["tier"] else " ✗"
            print(
                f"| {r['kind']} | `{p}` | {r['score']:.3f} | {r['tier']}{mark} | {r['expected']} |"
            )
    else:
        for r in out:
            mark = " " if r["expected"] == r["tier"] else "X"
            print(f"{mark} {r['score']:.3f} {r['tier']:5s} {r['kind']:26s} {r['prompt'][:80]}")
        print(f"threshold {threshold}; {agree} of {len(out)} as expected")
    RESULTS.write_text(
        json.dumps({"threshold": threshold, "as_expected": agree, "prompts": out}, indent=2) + "\n",
        "utf-8",
    )


if __name__ == "__main__":
    main()
