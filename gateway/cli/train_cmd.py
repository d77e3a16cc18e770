"""``tiergate train``: rebuild the shipped complexity classifier from the data in the repo
(``--export-only``: rewrite the serving export of an existing model file, without training)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["train"]

_REPO = Path(__file__).resolve().parents[2]

BLAS_KERNELS = "Haswell"
"""The OpenBLAS kernels training runs on (x86-64)."""
NUMPY_DISPATCH_OFF = "X86_V4 AVX512_ICL AVX512_SPR"
"""numpy's own SIMD paths above AVX2 (numpy 2.4's dispatch targets), switched off for training."""


def _pin_cpu_kernels(console: Console) -> None:
    """Train on the AVX2 code paths of OpenBLAS and numpy, whatever the CPU has. Results depend
    on the kernels in the third or fourth decimal (AVX-512 paths, in OpenBLAS or in numpy's own
    loops, round otherwise and train another model than AVX2 ones), so one set, which every
    x86-64 CPU of the last decade runs, makes ``tiergate train`` give the shipped model on any
    of them. Both libraries read their variable once, when numpy loads; one set by the caller
    is kept."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    if "numpy" in sys.modules:
        console.print("[yellow]numpy is already loaded: CPU kernels not pinned[/]")
        return
    os.environ.setdefault("OPENBLAS_CORETYPE", BLAS_KERNELS)
    os.environ.setdefault("NPY_DISABLE_CPU_FEATURES", NUMPY_DISPATCH_OFF)


def train(
    data_dir: Annotated[Path, typer.Option(help="training data folder")] = _REPO
    / "data"
    / "routing",
    out: Annotated[Path, typer.Option(help="model file to write (skops)")] = _REPO
    / "router"
    / "models"
    / "complexity.skops",
    seed: Annotated[int, typer.Option(help="random seed (same data + seed → same metrics)")] = 0,
    export_only: Annotated[
        bool,
        typer.Option(
            "--export-only",
            help="do not train: rewrite the serving export of the existing --out model file",
        ),
    ] = False,
) -> None:
    """Train the classifier; print its validation metrics; write the model, its card and its
    serving export."""
    console = Console()
    if export_only:
        _export(console, out)
        return
    _pin_cpu_kernels(console)
    from router.training import train as run_training

    with Progress(
        TextColumn("{task.description:<10}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks: dict[str, TaskID] = {}

        def report(stage: str, completed: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=max(total, 1))
            progress.update(tasks[stage], completed=completed, total=max(total, 1))

        result = run_training(data_dir, out, seed=seed, progress=report)
    ev = result.evaluation
    console.print(
        f"wrote {result.model_path} ({result.model_bytes / 1e6:.2f} MB), {result.card_path} "
        f"and {result.export_path}"
    )
    console.print(
        f"validation: MMLU-Pro AUC {ev.mmlu_auc:.3f} (8B wrong, 70B right), "
        f"everyday-vs-hard AUC {ev.everyday_vs_hard_auc:.3f}; threshold {ev.threshold:.3f} "
        f"sends {ev.large_share.get('mix', float('nan')):.0%} of the mix to the large tier"
    )
    ours, length = ev.mmlu_apgr.get("classifier", {}), ev.mmlu_apgr.get("prompt_length", {})
    if ours and length:
        console.print(
            f"MMLU-Pro APGR {ours['apgr']:.3f} {_interval(ours.get('apgr_ci95'))}, "
            f"prompt length {length['apgr']:.3f} {_interval(length.get('apgr_ci95'))}, "
            f"difference {ours['apgr_minus_prompt_length']:+.3f} "
            f"{_interval(ours.get('apgr_minus_prompt_length_ci95'))} (bootstrap 95%)"
        )
    for source, name in (("zeroeval_math_l5", "MATH level 5"), ("zeroeval_crux", "CRUXEval")):
        family = ev.family_apgr.get(source, {})
        ours, length = family.get("classifier", {}), family.get("prompt_length", {})
        if ours and length:
            console.print(
                f"{name} APGR {ours['apgr']:.3f} {_interval(ours.get('apgr_ci95'))}, "
                f"prompt length {length['apgr']:.3f}"
            )
    if ev.obvious:
        console.print(
            f"obvious cases (holdout, {ev.obvious['n']:.0f}): AUC {ev.obvious['auc']:.3f}, "
            f"easy sent large {ev.obvious['easy_large']:.1%}, "
            f"hard sent small {ev.obvious['hard_small']:.1%}"
        )
    steps = ev.gsm8k_steps_spearman
    if steps:
        console.print(
            f"GSM8K Spearman with solution steps {steps['classifier']:.3f}, "
            f"prompt length {steps['prompt_length']:.3f}"
        )


def _export(console: Console, model: Path) -> None:
    from router.model_file import ModelFileError
    from router.training.export import export_model_file

    try:
        path = export_model_file(model)
    except ModelFileError as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None
    console.print(
        f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB) from {model}",
        markup=False,
        soft_wrap=True,
    )


def _interval(value: object) -> str:
    if isinstance(value, list | tuple) and len(value) == 2:
        return f"[{float(value[0]):.3f}, {float(value[1]):.3f}]"
    return ""
