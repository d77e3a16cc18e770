"""The hand-written obvious-cases set stays valid, split as documented and length-balanced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / "data/routing/obvious/check.py"
CASES = CHECK.with_name("obvious_cases.jsonl")


def _run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), str(path)], capture_output=True, text=True, check=False
    )


def test_shipped_set_passes_its_check() -> None:
    result = _run(CASES)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout.splitlines()
    rows = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 400
    labels = {(r["label"], r["split"]) for r in rows}
    assert labels == {(lab, s) for lab in ("easy", "hard") for s in ("train", "holdout")}


def test_check_rejects_a_row_moved_to_the_other_split(tmp_path: Path) -> None:
    rows = CASES.read_text(encoding="utf-8").splitlines()
    first = json.loads(rows[0])
    first["split"] = "holdout" if first["split"] == "train" else "train"
    bad = tmp_path / "cases.jsonl"
    bad.write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n", encoding="utf-8")
    result = _run(bad)
    assert result.returncode == 1
    assert f"{first['id']} (" in result.stderr


def test_check_rejects_a_length_separable_set(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines()]
    short_easy = [
        r
        for r in rows
        if r["label"] == "hard" or sum(len(m["content"]) for m in r["messages"]) < 100
    ]
    seen: dict[tuple[str, str], int] = {}
    for r in short_easy:
        group = (r["label"], r["category"])
        r["split"] = ("train", "holdout")[seen.get(group, 0) % 2]
        seen[group] = seen.get(group, 0) + 1
    bad = tmp_path / "cases.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in short_easy) + "\n", encoding="utf-8")
    result = _run(bad)
    assert result.returncode == 1
    assert "length AUC" in result.stderr
