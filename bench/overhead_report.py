"""The overhead bench's summary: the headline figures, the README table rows, and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["headline", "markdown", "plot"]


def _point(points: list[dict[str, Any]] | None, concurrency: int) -> dict[str, Any] | None:
    return next((p for p in points or [] if p["concurrency"] == concurrency), None)


def _sustained(points: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    best = None
    for point in points or []:
        if point["sustained"]:
            best = point
    if best is None:
        return None
    through = best["through"]
    return {
        "rate_rps": best["rate_rps"],
        "achieved_rps": through["achieved_rps"],
        "added_p99_ms": best["added_latency_ms"]["p99"],
        "errors": sum(through["errors"].values()),
        "gateway_cpu_pct": through.get("gateway_cpu_pct"),
    }


def headline(results: dict[str, Any], *, p99_budget_ms: float = 20.0) -> dict[str, Any]:
    """The figures the README table shows (``None`` where a section was not run)."""
    closed = results.get("closed_loop")
    out: dict[str, Any] = {"p99_budget_ms": p99_budget_ms}
    for c in (1, 16, 64):
        point = _point(closed, c)
        out[f"added_latency_ms_c{c}"] = point["added_latency_ms"] if point else None
        out[f"gateway_cpu_ms_per_request_c{c}"] = (
            point.get("gateway_cpu_ms_per_request") if point else None
        )
    c1 = _point(closed, 1)
    out["stages_ms_c1"] = c1["through"]["server_timing_ms"] if c1 else None
    out["max_sustained_rate"] = _sustained(results.get("open_loop"))
    streams = results.get("streaming") or []
    if streams:
        one = _point(streams, 1)
        out["stream_ttft_ms_c1"] = one["added_ttft_ms"] if one else None
        out["stream_stages_ms_c1"] = one["through"].get("server_timing_ms") if one else None
        top = max(streams, key=lambda p: p["concurrency"])
        out["streaming"] = {
            "concurrency": top["concurrency"],
            "added_ttft_ms": top["added_ttft_ms"],
            "added_gap_ms_p99": top["through"]["added_gap_ms"]["p99"],
            "added_gap_ms_max": top["through"]["added_gap_ms"]["max"],
            "direct_added_gap_ms_p99": top["direct"]["added_gap_ms"]["p99"],
        }
    soak = results.get("soak")
    if soak:
        out["memory"] = {
            k: soak[k] for k in ("rss_mb_before", "rss_mb_after", "rss_growth_pct", "duration_s")
        }
    return out


def _f(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        value = f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    return f"{value}{unit}"


def markdown(results: dict[str, Any]) -> str:
    """The README's Performance table, from one run's results."""
    h = results["headline"]
    env = results["environment"]
    rows = ["| figure | measured | target (issue 7) |", "| --- | --- | --- |"]
    for c, target in ((1, "p50 < 2 ms, p99 < 5 ms"), (16, ""), (64, "")):
        added = h.get(f"added_latency_ms_c{c}")
        if added:
            rows.append(
                f"| added latency, concurrency {c} (p50 / p90 / p99) | {_f(added['p50'])} / "
                f"{_f(added['p90'])} / {_f(added['p99'])} ms | {target} |"
            )
    for c in (1, 16, 64):
        cpu = h.get(f"gateway_cpu_ms_per_request_c{c}")
        if cpu is not None:
            rows.append(f"| gateway CPU per request, concurrency {c} | {_f(cpu)} ms | |")
    rate = h.get("max_sustained_rate")
    budget = f"{h['p99_budget_ms']:g}"
    if "max_sustained_rate" in h:
        shown = (
            f"{_f(rate['rate_rps'])} rps (achieved {_f(rate['achieved_rps'])}, added p99 "
            f"{_f(rate['added_p99_ms'])} ms, {rate['errors']} errors)"
            if rate
            else "none of the rates tried"
        )
        rows.append(
            f"| highest rate on one gateway core, added p99 < {budget} ms | {shown} | ≥ 300 rps |"
        )
    one = h.get("stream_ttft_ms_c1")
    if one:
        rows.append(
            f"| streaming: added time to first token (p50 / p99), 1 stream "
            f"| {_f(one['p50'])} / {_f(one['p99'])} ms | p50 < 3 ms |"
        )
    stream = h.get("streaming")
    if stream:
        ttft = stream["added_ttft_ms"]
        rows.append(
            f"| streaming: added time to first token (p50 / p99), {stream['concurrency']} streams "
            f"| {_f(ttft['p50'])} / {_f(ttft['p99'])} ms | |"
        )
        rows.append(
            f"| streaming: added gap between chunks (p99 / max), {stream['concurrency']} streams "
            f"| {_f(stream['added_gap_ms_p99'])} / {_f(stream['added_gap_ms_max'])} ms "
            f"| p99 < 50 ms |"
        )
    memory = h.get("memory")
    if memory:
        fresh = " (a fresh gateway)" if results["soak"].get("fresh_gateway") else ""
        rows.append(
            f"| resident memory before → after {memory['duration_s']:g} s at "
            f"{results['soak']['rate_rps']:g} rps{fresh} | {_f(memory['rss_mb_before'])} → "
            f"{_f(memory['rss_mb_after'])} MB ({_f(memory['rss_growth_pct'], ' %')}) "
            f"| < 200 MB, < 10 % growth |"
        )
    retained = env.get("gateway_rss_mb_after_load_phases")
    if retained is not None:
        rows.append(
            f"| resident memory at ready → after the concurrency and rate points (the peak of "
            f"in-flight requests stays resident) | {_f(env.get('gateway_rss_mb_at_ready'))} → "
            f"{_f(retained)} MB | |"
        )
    for key, what in (
        ("stages_ms_c1", "tiergate's own time by stage, p50 (Server-Timing), concurrency 1"),
        ("stream_stages_ms_c1", "the same to a stream's first chunk, 1 stream"),
    ):
        stages = h.get(key)
        shown = ", ".join(f"{k} {_f(v['p50'])}" for k, v in stages.items()) if stages else ""
        rows.append(f"| {what} | {shown + ' ms' if shown else '—'} | |")
    commit = env["commit"][:10] + (" (dirty)" if env["dirty"] else "")
    pin = env["pinning"]
    where = (
        f"load generator, Redis and simulator on core {pin['load_generator']}, gateway on core "
        f"{pin['gateway']}"
        if pin["pinned"]
        else f"unpinned ({pin['reason']})"
    )
    errors = "no errors" if results["clean"] else f"**{results['errors_total']} errors**"
    rows.append("")
    rows.append(f"Commit {commit}, {env['date']}, {env['cpus']} x {env['cpu']}, {where}; {errors}.")
    return "\n".join(rows)


def plot(results: dict[str, Any], path: Path) -> None:
    """Four panels: added latency by concurrency, added p99 by open-loop rate, streaming, RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    _latency_panel(axes[0][0], results.get("closed_loop") or [])
    _rate_panel(axes[0][1], results.get("open_loop") or [], results["headline"]["p99_budget_ms"])
    _stream_panel(axes[1][0], results.get("streaming") or [])
    _memory_panel(axes[1][1], results.get("soak"))
    env = results["environment"]
    fig.suptitle(
        f"tiergate overhead vs direct — {env['commit'][:10]} — {env['date']} — "
        f"{env['cpus']} x {env['cpu']}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_panel(ax: Any, points: list[dict[str, Any]]) -> None:
    ax.set_title("added latency, closed loop (through - direct)", fontsize=10)
    width = 0.25
    for i, q in enumerate(("p50", "p90", "p99")):
        xs = [j + (i - 1) * width for j in range(len(points))]
        ax.bar(xs, [p["added_latency_ms"][q] or 0 for p in points], width, label=q)
    ax.set_xticks(range(len(points)), [f"c={p['concurrency']}" for p in points])
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)


def _rate_panel(ax: Any, points: list[dict[str, Any]], budget: float) -> None:
    ax.set_title("open loop: added p99 by offered rate", fontsize=10)
    rates = [p["rate_rps"] for p in points]
    ax.plot(rates, [p["added_latency_ms"]["p99"] for p in points], "o-", label="added p99")
    ax.plot(rates, [p["added_latency_ms"]["p50"] for p in points], "s--", label="added p50")
    ax.axhline(budget, color="red", linewidth=0.8, label=f"{budget:g} ms budget")
    for p in points:
        if p["through"]["errors"]:
            ax.annotate("errors", (p["rate_rps"], p["added_latency_ms"]["p99"] or 0), fontsize=7)
    ax.set_xlabel("requests/s")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)


def _stream_panel(ax: Any, points: list[dict[str, Any]]) -> None:
    ax.set_title("streaming: added TTFT and chunk gaps (ms)", fontsize=10)
    labels, values = [], []
    for p in points:
        c = p["concurrency"]
        labels += [f"TTFT p50\nc={c}", f"TTFT p99\nc={c}", f"gap p99\nc={c}", f"gap max\nc={c}"]
        values += [
            p["added_ttft_ms"]["p50"],
            p["added_ttft_ms"]["p99"],
            p["through"]["added_gap_ms"]["p99"],
            p["through"]["added_gap_ms"]["max"],
        ]
    ax.bar(range(len(values)), [v or 0 for v in values], color="tab:purple")
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("ms")


def _memory_panel(ax: Any, soak: dict[str, Any] | None) -> None:
    ax.set_title("gateway resident memory during the soak", fontsize=10)
    if not soak:
        ax.text(0.5, 0.5, "no soak run", ha="center", transform=ax.transAxes)
        return
    series = [(t, rss) for t, rss in soak["rss_mb_series"] if rss is not None]
    ax.plot([t for t, _ in series], [rss for _, rss in series], "-")
    ax.set_xlabel(f"s at {soak['rate_rps']:g} rps")
    ax.set_ylabel("MB")
    ax.set_ylim(bottom=0)
