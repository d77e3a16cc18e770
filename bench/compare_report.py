"""The comparison bench's summary (``bench.compare``): each gateway's figures, their ratios
(tiergate / LiteLLM's proxy), the table of README and docs/bench.md, and the plot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LABELS", "comparison", "figures", "markdown", "plot", "ratio"]

LABELS = {"tiergate": "tiergate", "litellm": "LiteLLM proxy"}
QUANTILES = ("p50", "p90", "p99")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` to 2 decimals; ``None`` unless both are above zero (an added
    latency at or below zero is the noise of a difference of percentiles: no ratio of it means
    anything)."""
    if numerator is None or denominator is None or numerator <= 0 or denominator <= 0:
        return None
    return round(numerator / denominator, 2)


def figures(view: dict[str, Any]) -> dict[str, float | None]:
    """One gateway's compared figures, flat: ``view`` holds its ``closed_loop``, ``open_loop``
    and ``streaming`` points (each against the direct target) and its ``rss_mb``. A rate is
    sustained as the open loop judged it (``sustained``, within the run's p99 budget)."""
    out: dict[str, float | None] = {}
    for point in view.get("closed_loop") or []:
        c = point["concurrency"]
        for q in QUANTILES:
            out[f"c{c}_added_latency_ms_{q}"] = point["added_latency_ms"][q]
        out[f"c{c}_cpu_ms_per_request"] = point.get("gateway_cpu_ms_per_request")
    if view.get("open_loop"):
        sustained = [p["rate_rps"] for p in view["open_loop"] if p["sustained"]]
        out["max_sustained_rps"] = max(sustained, default=None)
        fell = [p["rate_rps"] for p in view["open_loop"] if p["fell_over"]]
        out["fell_over_at_rps"] = fell[0] if fell else None
    for point in view.get("streaming") or []:
        c, through = point["concurrency"], point["through"]
        out[f"streams{c}_added_ttft_ms_p50"] = point["added_ttft_ms"]["p50"]
        out[f"streams{c}_added_ttft_ms_p99"] = point["added_ttft_ms"]["p99"]
        out[f"streams{c}_added_gap_ms_p99"] = through["added_gap_ms"]["p99"]
        out[f"streams{c}_added_gap_ms_max"] = through["added_gap_ms"]["max"]
        out[f"streams{c}_cpu_ms_per_stream"] = point.get("gateway_cpu_ms_per_stream")
    rss = view.get("rss_mb") or {}
    if rss:
        out["rss_mb_at_ready"] = rss.get("at_ready")
        out["rss_mb_max"] = rss.get("max")
    return out


def comparison(results: dict[str, Any], *, p99_budget_ms: float = 20.0) -> dict[str, Any]:
    """Every gateway's figures and, figure by figure, tiergate's over LiteLLM's (``p99_budget_ms``
    is the run's, for the table)."""
    by_gateway = {name: figures(view) for name, view in results["gateways"].items()}
    tiergate, litellm = by_gateway.get("tiergate", {}), by_gateway.get("litellm", {})
    keys = dict.fromkeys([*tiergate, *litellm])
    return {
        "p99_budget_ms": p99_budget_ms,
        "figures": by_gateway,
        "ratio_tiergate_to_litellm": {k: ratio(tiergate.get(k), litellm.get(k)) for k in keys},
    }


# --- the table ------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def _cell(values: list[float | None], unit: str, missing: str) -> str:
    if all(v is None for v in values):
        return missing
    return " / ".join(_num(v) for v in values) + unit


def _cells(comp: dict[str, Any], row: Row) -> list[str]:
    """One row's cells: each gateway's values and the ratios, ``a / b / c``."""
    _, keys, unit, missing = row
    figs, ratios = comp["figures"], comp["ratio_tiergate_to_litellm"]
    cells = [_cell([figs[g].get(k) for k in keys], unit, missing) for g in ("tiergate", "litellm")]
    return [*cells, _cell([ratios.get(k) for k in keys], "", "—")]


Row = tuple[str, list[str], str, str]
"""A table row: the figure, its keys, the unit, the text when no value."""


def _rows(comp: dict[str, Any]) -> list[Row]:
    """The rows of the figures the run has."""
    have = comp["figures"]["tiergate"]
    rows: list[Row] = []
    closed = sorted({int(k.split("_")[0][1:]) for k in have if k.endswith("_cpu_ms_per_request")})
    for c in closed:
        keys = [f"c{c}_added_latency_ms_{q}" for q in QUANTILES]
        rows.append((f"added latency, concurrency {c} (p50 / p90 / p99)", keys, " ms", "—"))
    for c in closed:
        keys = [f"c{c}_cpu_ms_per_request"]
        rows.append((f"gateway CPU per request, concurrency {c}", keys, " ms", "—"))
    if "max_sustained_rps" in have:
        budget = f"{comp['p99_budget_ms']:g}"
        label = f"highest rate on one gateway core, added p99 < {budget} ms"
        rows.append((label, ["max_sustained_rps"], " rps", "none of the rates tried"))
    streams = sorted({int(k.split("_")[0][7:]) for k in have if k.startswith("streams")})
    what = {c: "1 stream" if c == 1 else f"{c} streams" for c in streams}
    for c in streams:
        keys = [f"streams{c}_added_ttft_ms_p50", f"streams{c}_added_ttft_ms_p99"]
        label = f"streaming: added time to first token (p50 / p99), {what[c]}"
        rows.append((label, keys, " ms", "—"))
    if streams:
        c = streams[-1]
        keys = [f"streams{c}_added_gap_ms_p99", f"streams{c}_added_gap_ms_max"]
        label = f"streaming: added gap between chunks (p99 / max), {what[c]}"
        rows.append((label, keys, " ms", "—"))
    if "rss_mb_at_ready" in have:
        keys = ["rss_mb_at_ready", "rss_mb_max"]
        rows.append(("resident memory at ready / highest in the run", keys, " MB", "—"))
    return rows


def markdown(results: dict[str, Any]) -> str:
    """The comparison table, from one run's results."""
    comp = results["comparison"]
    lines = [
        f"| figure | {LABELS['tiergate']} | {LABELS['litellm']} | tiergate / LiteLLM |",
        "| --- | --- | --- | --- |",
    ]
    for row in _rows(comp):
        lines.append(f"| {row[0]} | " + " | ".join(_cells(comp, row)) + " |")
    env = results["environment"]
    commit = env["commit"][:10] + (" (dirty)" if env["dirty"] else "")
    pin = env["pinning"]
    where = (
        f"load generator, Redis and simulator on core {pin['load_generator']}, both gateways on "
        f"core {pin['gateway']}"
        if pin["pinned"]
        else f"unpinned ({pin['reason']})"
    )
    errors = "no errors" if results["clean"] else f"**{results['errors_total']} errors**"
    litellm = env["gateways"]["litellm"]["version"]
    label = f" {results['label']}." if results.get("label") else ""
    lines.append("")
    lines.append(
        f"Commit {commit}, {env['date']}, {env['cpus']} x {env['cpu']}, {where}; LiteLLM "
        f"{litellm}; {results['wall_s']:g} s; {errors}.{label}"
    )
    return "\n".join(lines)


# --- the plot -------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> None:
    """Four panels, a colour per gateway: added latency by concurrency, added p99 by open-loop
    rate, streaming, CPU per request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gateways = results["gateways"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    _bars(
        axes[0][0], gateways, "closed_loop", "added latency, closed loop (ms)",
        lambda p: [p["added_latency_ms"]["p50"], p["added_latency_ms"]["p99"]],
        lambda p: [f"c={p['concurrency']}\np50", f"c={p['concurrency']}\np99"], log=True,
    )  # fmt: skip
    _rates(axes[0][1], gateways, results["comparison"]["p99_budget_ms"])
    _bars(
        axes[1][0], gateways, "streaming", "streaming: added TTFT p50 and gap p99 (ms)",
        lambda p: [p["added_ttft_ms"]["p50"], p["through"]["added_gap_ms"]["p99"]],
        lambda p: [f"{p['concurrency']} str.\nTTFT", f"{p['concurrency']} str.\ngap"], log=True,
    )  # fmt: skip
    _bars(
        axes[1][1], gateways, "closed_loop", "gateway CPU per request (ms)",
        lambda p: [p.get("gateway_cpu_ms_per_request")],
        lambda p: [f"c={p['concurrency']}"],
    )  # fmt: skip
    env = results["environment"]
    label = f"\n{results['label']}" if results.get("label") else ""
    fig.suptitle(
        f"tiergate vs LiteLLM proxy {env['gateways']['litellm']['version']}, added to a direct "
        f"call — {env['commit'][:10]} — {env['date']} — {env['cpus']} x {env['cpu']}{label}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(
    ax: Any,
    gateways: dict[str, Any],
    section: str,
    title: str,
    values: Callable[[dict[str, Any]], list[float | None]],
    labels: Callable[[dict[str, Any]], list[str]],
    *,
    log: bool = False,
) -> None:
    ax.set_title(title, fontsize=10)
    width = 0.8 / max(1, len(gateways))
    ticks: list[str] = []
    for i, (name, view) in enumerate(gateways.items()):
        ys = [v or 0 for p in view.get(section) or [] for v in values(p)]
        xs = [j + (i - (len(gateways) - 1) / 2) * width for j in range(len(ys))]
        ax.bar(xs, ys, width, label=LABELS.get(name, name))
        ticks = ticks or [t for p in view.get(section) or [] for t in labels(p)]
    ax.set_xticks(range(len(ticks)), ticks, fontsize=7)
    ax.set_ylabel("ms (log)" if log else "ms")
    if log:  # one gateway's figures can be a hundred times the other's
        ax.set_yscale("symlog", linthresh=10)
    ax.legend(fontsize=8)


def _rates(ax: Any, gateways: dict[str, Any], budget: float) -> None:
    ax.set_title("open loop: added p99 by offered rate", fontsize=10)
    for name, view in gateways.items():
        points = view.get("open_loop") or []
        rates = [p["rate_rps"] for p in points]
        ax.plot(rates, [p["added_latency_ms"]["p99"] for p in points], "o-", label=LABELS[name])
    ax.axhline(budget, color="red", linewidth=0.8, label=f"{budget:g} ms budget")
    ax.set_xlabel("requests/s")
    ax.set_ylabel("ms (log)")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
