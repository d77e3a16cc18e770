"""``tiergate classify`` and ``tiergate eval``: score JSON Lines prompts; measure a router.

``classify`` reads lines with ``prompt`` (a string; or ``messages``, an OpenAI message list)
and writes each line back with ``score`` added, every other field kept. ``eval`` reads lines
with ``prompt``, ``weak_score`` and ``strong_score`` (quality of the small and the large
model's answer, 0..1) and prints APGR, CPT(50 %) and CPT(80 %) for the classifier, a random
router and the prompt-length router, each APGR with a bootstrap 95 % interval, and the
classifier's paired difference from the prompt-length router (see ``router.training.apgr``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["classify", "evaluate"]

ModelOpt = Annotated[
    Path | None, typer.Option("--model", help="model file (default: the shipped one)")
]


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(data, dict):
                raise typer.BadParameter(f"{path}:{number}: not a JSON object")
            yield number, data


def _features(path: Path, number: int, data: dict[str, Any]) -> Any:
    from router.features import PromptFeatures

    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return PromptFeatures.from_text(prompt)
    messages = data.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return PromptFeatures.from_messages(messages)
    raise typer.BadParameter(f"{path}:{number}: needs a string `prompt` (or a `messages` list)")


def _load(model: Path | None) -> Any:
    from router.model_file import ModelFileError, load_classifier

    try:
        return load_classifier(model)
    except ModelFileError as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None


def classify(
    input: Annotated[Path, typer.Option("--input", "-i", help="JSONL with `prompt`", exists=True)],
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL to write")],
    model: ModelOpt = None,
) -> None:
    """Add the classifier's `score` to every line of a JSON Lines file."""
    classifier = _load(model)
    count = 0
    with output.open("w", encoding="utf-8") as out:
        for number, data in _lines(input):
            data["score"] = classifier.score(_features(input, number, data))
            out.write(json.dumps(data, ensure_ascii=False) + "\n")
            count += 1
    typer.echo(f"scored {count} prompts → {output}", err=True)


def _quality(path: Path, number: int, data: dict[str, Any], key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise typer.BadParameter(f"{path}:{number}: `{key}` must be a number in [0, 1]")
    return float(value)


def evaluate(
    input: Annotated[
        Path,
        typer.Option(
            "--input", "-i", help="JSONL with `prompt`, `weak_score`, `strong_score`", exists=True
        ),
    ],
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="write the curve as PNG")] = None,
    model: ModelOpt = None,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples (0: no intervals)")] = 1000,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
) -> None:
    """APGR and CPT(50%), CPT(80%) of the classifier, a random and a prompt-length router."""
    import numpy as np

    from router.training.apgr import compare_routers, cost_quality_curve, length_scores

    classifier = _load(model)
    prompts: list[str] = []
    scores: list[float] = []
    weak: list[float] = []
    strong: list[float] = []
    for number, data in _lines(input):
        features = _features(input, number, data)
        weak.append(_quality(input, number, data, "weak_score"))
        strong.append(_quality(input, number, data, "strong_score"))
        prompts.append(features.last_user_text)
        scores.append(classifier.score(features))
    routers = {
        "classifier": np.asarray(scores),
        "random": np.zeros(len(scores)),
        "prompt_length": length_scores(prompts),
    }
    result = compare_routers(
        routers, weak, strong, resamples=resamples, seed=seed, baseline="prompt_length"
    )
    legend: dict[str, str] = {}
    if plot is not None:
        from router.training.plot import write_curve_png

        curves = {name: cost_quality_curve(v, weak, strong) for name, v in routers.items()}
        legend = write_curve_png(curves, plot)
    if json_out:
        typer.echo(json.dumps(_nan_to_null(result), indent=2, allow_nan=False))
        return
    _print_table(result, len(scores), legend, plot)


def _nan_to_null(value: Any) -> Any:
    """Strict JSON: undefined metrics (no quality gap between the models) become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_null(v) for v in value]
    return value


def _print_table(
    result: dict[str, dict[str, Any]], n: int, legend: dict[str, str], plot: Path | None
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{n} prompts")
    for column in ("router", "APGR", "95% CI", "CPT(50%)", "CPT(80%)"):
        table.add_column(column, justify="left" if column == "router" else "right")
    for name, m in result.items():
        ci = m.get("apgr_ci95")
        table.add_row(
            name + (f" ({legend[name]})" if name in legend else ""),
            f"{m['apgr']:.3f}",
            "—" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
            f"{m['cpt50']:.1%}",
            f"{m['cpt80']:.1%}",
        )
    console = Console()
    console.print(table)
    diff = result["classifier"].get("apgr_minus_prompt_length")
    diff_ci = result["classifier"].get("apgr_minus_prompt_length_ci95")
    if diff is not None and diff_ci is not None:
        console.print(
            f"classifier - prompt length: {diff:+.3f} APGR, paired 95% CI "
            f"[{diff_ci[0]:+.3f}, {diff_ci[1]:+.3f}]"
        )
    if plot is not None:
        console.print(f"wrote {plot} (PGR against cost; grey diagonal: random)")
