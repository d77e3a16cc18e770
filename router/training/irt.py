"""Item response theory on an outcome matrix: a difficulty and a discrimination per question,
an ability per model (two-parameter logistic, 2PL), fitted by gradient descent.

P(model j right on question i) = floor + (1 - floor) · logistic(a_i · (theta_j - b_i)).
Missing flags are left out of the likelihood. A weak Gaussian prior on theta, b and log a keeps
rare questions (all right or all wrong) finite. Deterministic: no randomness, fixed iterations,
numpy only.

Used for labels (``router.training.labels``): the large model's expected gain on a question is
P(70B right) - P(8B right), from the many models' outcomes rather than one noisy draw of each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["IrtFit", "fit_2pl"]


@dataclass(frozen=True, slots=True)
class IrtFit:
    discrimination: np.ndarray
    difficulty: np.ndarray
    ability: np.ndarray
    floor: float

    def p_correct(self, column: int) -> np.ndarray:
        """P(right) of model ``column`` on every question."""
        z = self.discrimination * (self.ability[column] - self.difficulty)
        result: np.ndarray = self.floor + (1 - self.floor) / (1 + np.exp(-z))
        return result


def fit_2pl(
    correct: np.ndarray,
    observed: np.ndarray,
    *,
    floor: float = 0.0,
    iterations: int = 300,
    learning_rate: float = 0.1,
    prior: float = 0.01,
) -> IrtFit:
    """Fit a 2PL model to ``correct`` (questions x models, 0/1) where ``observed`` is 1 (Adam)."""
    n, m = correct.shape
    share = (correct * observed).sum(1) / np.maximum(observed.sum(1), 1)
    share = np.clip(share, 0.02, 0.98)
    theta = np.zeros(m)
    b = -np.log(share / (1 - share))
    log_a = np.zeros(n)
    params = [theta, b, log_a]
    first = [np.zeros_like(p) for p in params]
    second = [np.zeros_like(p) for p in params]
    for step in range(1, iterations + 1):
        a = np.exp(log_a)
        s = 1 / (1 + np.exp(-(a[:, None] * (theta[None, :] - b[:, None]))))
        p = np.clip(floor + (1 - floor) * s, 1e-6, 1 - 1e-6)
        dz = (p - correct) / (p * (1 - p)) * observed * (1 - floor) * s * (1 - s)
        grads = [
            ((dz * a[:, None]).sum(0) + prior * theta * n / m) / n,
            -(dz * a[:, None]).sum(1) + prior * b,
            (dz * (theta[None, :] - b[:, None])).sum(1) * a + prior * 10 * log_a,
        ]
        for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
            first[i] = 0.9 * first[i] + 0.1 * grad
            second[i] = 0.999 * second[i] + 0.001 * grad * grad
            corrected = first[i] / (1 - 0.9**step)
            scale = np.sqrt(second[i] / (1 - 0.999**step)) + 1e-8
            param -= learning_rate * corrected / scale
        theta -= theta.mean()
    return IrtFit(np.exp(log_a), b, theta, floor)
