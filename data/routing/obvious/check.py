"""Validate obvious_cases.jsonl and report its balance (standard library only).

Usage: python3 data/routing/obvious/check.py [path/to/obvious_cases.jsonl]

Checks the schema of every row, that ids are unique and contents are not duplicated, that every
category belongs to one label, that the split alternates train/holdout within every
(label, category) group in id order, and that total prompt length cannot separate the labels: the
pairwise ROC AUC of total characters (hard vs easy) must lie in [0.40, 0.60]. Prints counts per
label, category and split, and length quartiles per label. Exits non-zero on any failure.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

LABELS = ("easy", "hard")
SPLITS = ("train", "holdout")
ROLES = ("system", "user", "assistant")
KEYS = {"id", "label", "category", "split", "messages"}
AUC_RANGE = (0.40, 0.60)
ID_RE = re.compile(r"oc-\d{4}")
CATEGORY_RE = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    category: str
    split: str
    messages: tuple[tuple[str, str], ...]

    @property
    def chars(self) -> int:
        """Total characters over all messages: the length a length-only router would see."""
        return sum(len(content) for _, content in self.messages)


def _scalar_errors(row: dict[str, object]) -> list[str]:
    errors = []
    if not isinstance(row["id"], str) or not ID_RE.fullmatch(row["id"]):
        errors.append(f"bad id {row['id']!r}")
    if row["label"] not in LABELS:
        errors.append(f"bad label {row['label']!r}")
    if row["split"] not in SPLITS:
        errors.append(f"bad split {row['split']!r}")
    category = row["category"]
    if not isinstance(category, str) or not CATEGORY_RE.fullmatch(category):
        errors.append(f"bad category {category!r}")
    return errors


def _message_errors(messages: object) -> list[str]:
    if not isinstance(messages, list) or not messages:
        return ["messages must be a non-empty list"]
    errors = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            errors.append(f"message {i} must have exactly role and content")
        elif m["role"] not in ROLES:
            errors.append(f"message {i} has bad role {m['role']!r}")
        elif not isinstance(m["content"], str) or not m["content"].strip():
            errors.append(f"message {i} has empty content")
        elif m["role"] == "system" and i != 0:
            errors.append(f"message {i}: a system message must come first")
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") != "user":
        errors.append("the last message must be from the user")
    return errors


def parse_row(raw: object) -> tuple[Row | None, list[str]]:
    if not isinstance(raw, dict) or set(raw) != KEYS:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        return None, [f"expected an object with keys {sorted(KEYS)}, got {keys}"]
    errors = _scalar_errors(raw) + _message_errors(raw["messages"])
    if errors:
        return None, errors
    messages = tuple((m["role"], m["content"]) for m in raw["messages"])
    row = Row(raw["id"], raw["label"], raw["category"], raw["split"], messages)
    return row, []


def load(path: Path) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    failures: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            failures.append(f"line {lineno}: invalid JSON ({exc})")
            continue
        row, errors = parse_row(raw)
        failures.extend(f"line {lineno}: {e}" for e in errors)
        if row is not None:
            rows.append(row)
    return rows, failures


def groups_of(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r.id):
        groups[(r.label, r.category)].append(r)
    return groups


def set_failures(rows: list[Row]) -> list[str]:
    """Duplicate ids or contents, categories shared by both labels, and the split rule."""
    failures = [f"duplicate id {i}" for i, n in Counter(r.id for r in rows).items() if n > 1]
    contents = Counter(r.messages for r in rows)
    failures += [
        f"duplicate messages ({n}x): {c[-1][1][:60]!r}" for c, n in contents.items() if n > 1
    ]
    labels_of = defaultdict(set)
    for r in rows:
        labels_of[r.category].add(r.label)
    failures += [
        f"category {c!r} used by both labels" for c, ls in labels_of.items() if len(ls) > 1
    ]
    for (label, category), members in sorted(groups_of(rows).items()):
        for k, r in enumerate(members):
            if r.split != SPLITS[k % 2]:
                failures.append(f"{r.id} ({label}/{category}): split {r.split} != {SPLITS[k % 2]}")
    return failures


def auc(hard: list[int], easy: list[int]) -> float:
    """P(a random hard prompt is longer than a random easy one), ties counting one half."""
    wins = 0.0
    for h in hard:
        for e in easy:
            wins += 1.0 if h > e else 0.5 if h == e else 0.0
    return wins / (len(hard) * len(easy))


def report(rows: list[Row], name: str) -> tuple[list[str], float | None]:
    """The printed summary, and the overall length AUC (None when a label has < 2 rows)."""
    lines = [f"{name}: {len(rows)} valid rows", "", "label   total  train  holdout"]
    by_label = Counter(r.label for r in rows)
    by_split = Counter((r.label, r.split) for r in rows)
    for lab in LABELS:
        train, hold = by_split[(lab, "train")], by_split[(lab, "holdout")]
        lines.append(f"{lab:6} {by_label[lab]:6} {train:6} {hold:8}")
    lines += ["", "label  category                    n  train  holdout  median_chars"]
    for (lab, category), members in sorted(groups_of(rows).items()):
        hold = sum(1 for r in members if r.split == "holdout")
        med = statistics.median(r.chars for r in members)
        lines.append(
            f"{lab:6} {category:24} {len(members):4} {len(members) - hold:6} {hold:8} {med:13.0f}"
        )
    lengths = {lab: sorted(r.chars for r in rows if r.label == lab) for lab in LABELS}
    if any(len(xs) < 2 for xs in lengths.values()):
        return lines, None
    lines += [
        "",
        "total characters per prompt (all messages)",
        "label     min     q1  median     q3     max",
    ]
    for lab, xs in lengths.items():
        q1, q2, q3 = statistics.quantiles(xs, n=4)
        lines.append(f"{lab:6} {xs[0]:6} {q1:6.0f} {q2:7.0f} {q3:6.0f} {xs[-1]:7}")
    overall = auc(lengths["hard"], lengths["easy"])
    lines.append(f"length AUC (hard vs easy), all    : {overall:.3f}")
    for split in SPLITS:
        hard = [r.chars for r in rows if r.split == split and r.label == "hard"]
        easy = [r.chars for r in rows if r.split == split and r.label == "easy"]
        lines.append(f"length AUC (hard vs easy), {split:7}: {auc(hard, easy):.3f}")
    return lines, overall


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(__file__).with_name("obvious_cases.jsonl")
    rows, failures = load(path)
    failures += set_failures(rows)
    lines, overall = report(rows, path.name)
    if overall is None:
        failures.append("each label needs at least two valid rows")
    elif not AUC_RANGE[0] <= overall <= AUC_RANGE[1]:
        failures.append(f"length AUC {overall:.3f} outside {AUC_RANGE}")
    lines += ["", "OK" if not failures else f"{len(failures)} failure(s)"]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stderr.write("".join(f"FAIL: {f}\n" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
