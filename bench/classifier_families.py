"""Per-family APGR of the router against prompt length, by grouped cross-validation.

Five folds by question group (``router.training.data.row_group``); each fold fits the shipped
recipe (``router.training.train``: the same labels, format variants and pipeline) on the other
four and scores its own. The obvious cases' train half is in every fold's training and never
scored; their holdout half is never trained on. Per family:

* MMLU-Pro, MATH level 5, CRUXEval: APGR with the real Llama-3.1 8B / 70B flags;
* GSM8K: proxy APGR (weak 0, strong = the step label of ``router.training.labels``);
* chat/arena: vicuna bench (gain 0) against arena-hard v0.1 (gain 1);
* self-instruct: self-instruct (gain 0) against arena-hard v2.0 (coding and maths 1, creative
  writing 0.5);
* obvious cases (holdout): easy gain 0, hard gain 1;

for the learnt score alone (``learnt``: no length slope), prompt length (``len(prompt)``) and the
blend (``router``: the learnt logit plus the per-kind length slopes of ``SLOPES``, which the
shipped model applies, ``router.training.blend``), each with a bootstrap 95 % interval and the
paired difference from length. ``--sweep`` prints the blend for other slopes (how SLOPES was
chosen).

**Formats the training never saw**: every scored MMLU-Pro question re-rendered as four of its
options written ``(A)`` with an ``Answer:`` line inside a ChatML template (``mmlu_unseen``),
with ``A:`` options after a ``Question:`` header and a system prompt in a Llama-3 template
(``mmlu_unseen_llama3``); MATH problems with a "put the answer in \\boxed{}" line in a Llama-3
template (``math_template``); CRUX items in a Markdown code block (``crux_markdown``).

    .venv/bin/python bench/classifier_families.py [--resamples 1000] [--sweep]

writes ``bench/results/classifier_families.json``. About 5 minutes on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.classifier import model_text_of  # noqa: E402
from router.training.apgr import compare_routers, cost_quality_curve  # noqa: E402
from router.training.data import Row, load_rows, row_group  # noqa: E402
from router.training.labels import LabelScheme, targets, training_targets  # noqa: E402
from router.training.pipeline import OPEN_PIPELINE, build_pipeline  # noqa: E402
from router.training.train import LENGTH_SLOPES, _examples  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "classifier_families.json"
FOLDS = 5
CHATML = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
LLAMA3 = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are an expert tutor."
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


def _fold(row: Row) -> int:
    digest = hashlib.blake2b(row_group(row).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % FOLDS


def _options(prompt: str) -> tuple[str, list[str]] | None:
    lines = prompt.split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith("A. ")), None)
    if first is None:
        return None
    options = [line[3:] for line in lines[first:] if len(line) > 2 and line[1:3] == ". "]
    return "\n".join(lines[:first]), options


def mmlu_unseen(row: Row, style: str) -> str:
    parsed = _options(row.prompt)
    if parsed is None:
        return row.prompt
    stem, options = parsed
    rng = random.Random(row.id)
    chosen = sorted(rng.sample(range(len(options)), min(4, len(options))))
    if style == "chatml":
        body = "\n".join(f"({'ABCD'[j]}) {options[i]}" for j, i in enumerate(chosen))
        return CHATML.format(f"{stem}\n{body}\nAnswer:")
    body = "\n".join(f"{'ABCD'[j]}: {options[i]}" for j, i in enumerate(chosen))
    return LLAMA3.format(f"Question: {stem}\n{body}\nRespond with the letter of the answer.")


UNSEEN: dict[str, tuple[str, Callable[[Row], str]]] = {
    "mmlu_unseen": ("mmlu_pro", lambda r: mmlu_unseen(r, "chatml")),
    "mmlu_unseen_llama3": ("mmlu_pro", lambda r: mmlu_unseen(r, "llama3")),
    "math_template": (
        "zeroeval_math_l5",
        lambda r: LLAMA3.format(r.prompt + "\n\nPut the final answer in \\boxed{}."),
    ),
    "crux_markdown": (
        "zeroeval_crux",
        lambda r: r.prompt.replace("[PYTHON]", "```python").replace("[/PYTHON]", "```"),
    ),
}
EVERYDAY = {"self_instruct_seed_tasks", "self_instruct_user_oriented"}


def family_of(row: Row) -> str | None:
    if row.source == "mmlu_pro":
        return "mmlu_pro"
    if row.source in ("zeroeval_math_l5", "zeroeval_crux"):
        return row.source
    if row.source == "gsm8k_train":
        return "gsm8k"
    if row.source in ("vicuna_bench", "arena_hard_v0.1"):
        return "chat_arena"
    if row.source in EVERYDAY or row.source == "arena_hard_v2.0":
        return "self_instruct"
    if row.source == "obvious_cases" and row.split == "holdout":
        return "obvious"
    return None


def qualities(row: Row) -> tuple[float, float]:
    """(weak, strong) quality of a row for its family's APGR."""
    if row.weak_correct is not None and row.strong_correct is not None:
        return float(row.weak_correct), float(row.strong_correct)
    if row.source == "gsm8k_train":
        return 0.0, targets([row], LabelScheme())[0].p
    if row.source in ("vicuna_bench", *EVERYDAY):
        return 1.0, 1.0
    if row.source.startswith("arena_hard"):
        return 0.0, 0.5 if row.category == "creative_writing" else 1.0
    return 0.0, 1.0 if row.difficulty == "hard" else 0.0


def _steps(text: str) -> tuple[str, int]:
    head = text.split("\n", 1)[0].split()
    kind = head[0][4:]
    return kind, sum(1 for t in head if t.startswith(f"tgm{kind}tick"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = load_rows(ROOT / "data" / "routing")
    scored: list[tuple[str, Row, str]] = []  # (family, row, text)
    for row in rows:
        family = family_of(row)
        if family is not None:
            scored.append((family, row, row.prompt))
    for name, (source, render) in UNSEEN.items():
        scored.extend((name, row, render(row)) for row in rows if row.source == source)
    texts = [model_text_of(text) for _, _, text in scored]
    logits = np.zeros(len(scored))
    scheme = LabelScheme()
    with threadpool_limits(limits=1):
        for k in range(FOLDS):
            train_rows = [
                r for r in rows if (r.split == "train") or (r.split is None and _fold(r) != k)
            ]
            labelled = training_targets(train_rows, scheme)
            pipeline = build_pipeline(OPEN_PIPELINE)
            features = pipeline.named_steps["features"]
            matrix = features.fit_transform([model_text_of(t.row.prompt) for t in labelled]).tocsr()
            index, classes, weights = _examples(labelled)
            pipeline.named_steps["model"].fit(
                matrix[index], np.asarray(classes), sample_weight=np.asarray(weights)
            )
            at = [
                i
                for i, (_, row, _) in enumerate(scored)
                if row.split == "holdout" or (row.split is None and _fold(row) == k)
            ]
            logits[at] = pipeline.decision_function([texts[i] for i in at])
            print(f"fold {k}: {len(labelled)} rows, {time.perf_counter() - started:.0f} s")
    kinds_steps = [_steps(t) for t in texts]
    steps = np.array([s for _, s in kinds_steps], dtype=float)
    kinds = np.array([k for k, _ in kinds_steps])
    families = np.array([f for f, _, _ in scored])
    weak = np.array([qualities(r)[0] for _, r, _ in scored])
    strong = np.array([qualities(r)[1] for _, r, _ in scored])
    length = np.array([len(text) for _, _, text in scored], dtype=float)

    def _apgr(scores: np.ndarray, family: str) -> float:
        i = families == family
        return cost_quality_curve(scores[i], weak[i], strong[i]).apgr

    def blended(slopes: dict[str, float]) -> np.ndarray:
        slope = np.array([slopes.get(k, 0.0) for k in kinds])
        result: np.ndarray = logits + slope * steps
        return result

    if args.sweep:
        for kind in ("mc", "code", "math", "txt"):
            for slope in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4):
                s = blended({**LENGTH_SLOPES, kind: slope})
                line = " ".join(
                    f"{f}:{_apgr(s, f) - _apgr(length, f):+.3f}" for f in sorted(set(families))
                )
                print(f"{kind} {slope}: {line}")
    router = blended(dict(LENGTH_SLOPES))
    results: dict[str, object] = {}
    for family in sorted(set(families)):
        i = families == family
        compared = compare_routers(
            {"router": router[i], "learnt": logits[i], "prompt_length": length[i]},
            weak[i],
            strong[i],
            resamples=args.resamples,
            baseline="prompt_length",
        )
        results[family] = compared
        r, ln, lt = (compared[n]["apgr"] for n in ("router", "prompt_length", "learnt"))
        print(f"{family:20s} n={int(i.sum()):5d} router {r:.3f}  learnt {lt:.3f}  length {ln:.3f}")
    trained = [
        f
        for f in (
            "mmlu_pro",
            "zeroeval_math_l5",
            "zeroeval_crux",
            "gsm8k",
            "chat_arena",
            "self_instruct",
            "obvious",
        )
    ]
    average = {
        name: float(np.mean([results[f][name]["apgr"] for f in trained]))  # type: ignore[index]
        for name in ("router", "learnt", "prompt_length")
    }
    print("average over the seven families", average)
    out = {
        "folds": FOLDS,
        "resamples": args.resamples,
        "length_slopes": dict(LENGTH_SLOPES),
        "families": results,
        "average_of_families": average,
        "seconds": round(time.perf_counter() - started, 1),
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", "utf-8")


if __name__ == "__main__":
    main()
