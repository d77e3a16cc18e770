"""Cost-quality curves of a router: APGR, CPT, bootstrap intervals (RouteLLM, arXiv 2406.18665).

Each prompt has a score (higher: more in need of the strong model) and two qualities in
[0, 1], ``weak`` and ``strong``. Sorting by score, highest first, and sending the top k of N
prompts to the strong model costs c = k/N and gives quality

    r(c) = (Σ weak + Σ_{top k} (strong - weak)) / N

PGR(c) = (r(c) - r_weak) / (r_strong - r_weak) is the share of the gap between the all-weak
and the all-strong quality that the router recovers; APGR = ∫₀¹ PGR(c) dc; CPT(x) is the
smallest c with PGR(c) ≥ x.

Tied scores share their gain evenly (each prompt of a tie group counts the group's mean gain),
so the order within a tie does not matter and a constant score — the random router in
expectation — gives PGR(c) = c, APGR 0.5 and CPT(x) = x exactly. Between k and k + 1 the curve
is linear, so the integral is the trapezoid rule over k = 0..N, which is exact.

When every prompt has strong = weak the gap is zero and PGR is undefined: the metrics are NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Curve",
    "RouterMetrics",
    "bootstrap_interval",
    "compare_routers",
    "cost_quality_curve",
    "length_scores",
    "router_metrics",
]

CPT_LEVELS = (0.5, 0.8)


@dataclass(frozen=True, slots=True)
class Curve:
    """The cost-quality curve at c = k/N, k = 0..N."""

    cost: np.ndarray
    quality: np.ndarray
    """r(c), mean quality when the top k go to the strong model."""
    pgr: np.ndarray
    """PGR(c); NaN everywhere when the strong and weak qualities are equal."""

    @property
    def apgr(self) -> float:
        if len(self.cost) < 2 or np.isnan(self.pgr).any():
            return float("nan")
        heights = (self.pgr[1:] + self.pgr[:-1]) / 2
        return float(np.sum(heights * np.diff(self.cost)))

    def cpt(self, level: float) -> float:
        """Smallest cost whose PGR reaches ``level`` (linear inside each step; NaN if never)."""
        if np.isnan(self.pgr).any():
            return float("nan")
        reached = np.nonzero(self.pgr >= level - 1e-12)[0]
        if len(reached) == 0:
            return float("nan")
        k = int(reached[0])
        if k == 0:
            return 0.0
        low, high = float(self.pgr[k - 1]), float(self.pgr[k])
        fraction = (level - low) / (high - low) if high > low else 1.0
        return float(self.cost[k - 1] + fraction * (self.cost[k] - self.cost[k - 1]))


def _tie_mean_gains(scores: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Gains in descending-score order, each replaced by its tie group's mean."""
    order = np.argsort(-scores, kind="stable")
    ordered_scores = scores[order]
    ordered_gains = gains[order]
    starts = np.concatenate(([True], ordered_scores[1:] != ordered_scores[:-1]))
    group = np.cumsum(starts) - 1
    sums = np.bincount(group, weights=ordered_gains)
    sizes = np.bincount(group)
    means: np.ndarray = (sums / sizes)[group]
    return means


def cost_quality_curve(
    scores: Sequence[float] | np.ndarray,
    weak: Sequence[float] | np.ndarray,
    strong: Sequence[float] | np.ndarray,
) -> Curve:
    """The curve of a router with these ``scores`` over prompts with these qualities."""
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(weak, dtype=np.float64)
    g = np.asarray(strong, dtype=np.float64) - w
    n = len(s)
    if not (len(w) == len(g) == n):
        raise ValueError("scores, weak and strong must have the same length")
    if n == 0:
        empty = np.zeros(1)
        return Curve(cost=empty, quality=np.full(1, np.nan), pgr=np.full(1, np.nan))
    cumulative = np.concatenate(([0.0], np.cumsum(_tie_mean_gains(s, g))))
    quality = (float(np.sum(w)) + cumulative) / n
    gap = float(np.sum(g)) / n
    pgr = np.full(n + 1, np.nan) if abs(gap) < 1e-12 else (quality - quality[0]) / gap
    return Curve(cost=np.arange(n + 1) / n, quality=quality, pgr=pgr)


@dataclass(frozen=True, slots=True)
class RouterMetrics:
    apgr: float
    cpt50: float
    cpt80: float
    apgr_ci95: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"apgr": self.apgr, "cpt50": self.cpt50, "cpt80": self.cpt80}
        if self.apgr_ci95 is not None:
            out["apgr_ci95"] = list(self.apgr_ci95)
        return out


def router_metrics(curve: Curve) -> RouterMetrics:
    return RouterMetrics(apgr=curve.apgr, cpt50=curve.cpt(0.5), cpt80=curve.cpt(0.8))


def length_scores(prompts: Sequence[str]) -> np.ndarray:
    """The prompt-length router: longer prompts go to the strong model first."""
    return np.fromiter((len(p) for p in prompts), dtype=np.float64, count=len(prompts))


def bootstrap_interval(
    statistic: Callable[[np.ndarray], float],
    n: int,
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of ``statistic(indices)`` over resamples of range(n) with replacement.

    NaN resamples (a resample without any gap) are left out.
    """
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n, n)) for _ in range(resamples)])
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return (float("nan"), float("nan"))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return (float(low), float(high))


def compare_routers(
    routers: Mapping[str, Sequence[float] | np.ndarray],
    weak: Sequence[float] | np.ndarray,
    strong: Sequence[float] | np.ndarray,
    *,
    resamples: int = 1000,
    seed: int = 0,
    baseline: str | None = None,
) -> dict[str, dict[str, object]]:
    """Metrics per router, with a bootstrap 95 % interval of APGR (``resamples=0``: none).

    With ``baseline`` each other router also gets ``apgr_minus_<baseline>``, the paired
    difference, with its own interval (the same resamples for both routers).
    """
    w = np.asarray(weak, dtype=np.float64)
    s = np.asarray(strong, dtype=np.float64)
    arrays = {name: np.asarray(values, dtype=np.float64) for name, values in routers.items()}
    n = len(w)
    out: dict[str, dict[str, object]] = {}
    for name, values in arrays.items():
        metrics = router_metrics(cost_quality_curve(values, w, s))
        if resamples > 0 and n > 0:

            def resampled(i: np.ndarray, v: np.ndarray = values) -> float:
                return cost_quality_curve(v[i], w[i], s[i]).apgr

            interval = bootstrap_interval(resampled, n, resamples=resamples, seed=seed)
            metrics = RouterMetrics(metrics.apgr, metrics.cpt50, metrics.cpt80, interval)
        out[name] = {"n": n, **metrics.to_dict()}
    if baseline is not None and baseline in arrays and resamples > 0 and n > 0:
        base = arrays[baseline]
        for name, values in arrays.items():
            if name == baseline:
                continue

            def difference(i: np.ndarray, v: np.ndarray = values) -> float:
                return (
                    cost_quality_curve(v[i], w[i], s[i]).apgr
                    - cost_quality_curve(base[i], w[i], s[i]).apgr
                )

            point = float(out[name]["apgr"]) - float(out[baseline]["apgr"])  # type: ignore[arg-type]
            out[name][f"apgr_minus_{baseline}"] = point
            out[name][f"apgr_minus_{baseline}_ci95"] = list(
                bootstrap_interval(difference, n, resamples=resamples, seed=seed)
            )
    return out
