"""ε lower bounds from an attack's counts: what an audit may claim, and no more.

For an (ε, δ)-DP mechanism and any test that says "the canary was in", with true and
false positive rates TPR and FPR over the two worlds (Kairouz et al. 2015, Thm 2.1):

    TPR ≤ e^ε·FPR + δ        and        1 − FPR ≤ e^ε·(1 − TPR) + δ.

Counts only estimate the rates, so each is replaced by its one-sided Clopper–Pearson
bound (TPR from below, FPR from above), each at 1 − α/2 so that both hold together with
confidence 1 − α; any ε below the returned figure is then refuted at that confidence.
The one-run bound is Steinke, Nasr and Jagielski's (2023): see `one_run_p_value`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize, stats

__all__ = [
    "LowerBound",
    "clopper_pearson",
    "one_run_epsilon",
    "one_run_p_value",
    "two_world_ceiling",
    "two_world_epsilon",
]


@dataclass(frozen=True)
class LowerBound:
    """What every audit reports: an ε lower bound for one silo against one observer at δ
    and a confidence, beside the ε its ledger accounts against that observer."""

    algorithm: str
    silo: str
    observer: str
    """"server", or the hospital whose view was audited (Dopamine's "hospitals" view)."""
    canary: str
    """The kind of canary planted (`GradientCanary`, `InputCanary`)."""
    delta: float
    confidence: float
    epsilon_lower: float
    epsilon_ledger: float

    @property
    def exceeds_ledger(self) -> bool:
        """A lower bound above the ledger's ε: the code leaks more than it accounts for."""
        return self.epsilon_lower > self.epsilon_ledger


def clopper_pearson(
    successes: ArrayLike, trials: ArrayLike, alpha: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """One-sided exact bounds (lower, upper) on a binomial proportion, each holding with
    probability at least 1 − α: the α quantile of Beta(k, n − k + 1) and the 1 − α
    quantile of Beta(k + 1, n − k) (0 and 1 at the ends)."""
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha, k, n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, n - k), 1.0)
    return np.asarray(lower, np.float64), np.asarray(upper, np.float64)


def two_world_epsilon(
    true_positives: ArrayLike,
    positives: ArrayLike,
    false_positives: ArrayLike,
    negatives: ArrayLike,
    delta: float,
    confidence: float = 0.95,
) -> NDArray[np.float64]:
    """The ε that a test with these counts refutes at `confidence` (0: none), elementwise:
    `positives` trials with the canary of which `true_positives` were flagged, and
    `negatives` without it of which `false_positives` were flagged."""
    _check(delta, confidence)
    alpha = (1 - confidence) / 2  # two bounds, jointly at `confidence` (union bound)
    tpr, _ = clopper_pearson(true_positives, positives, alpha)
    _, fpr = clopper_pearson(false_positives, negatives, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = np.log(np.maximum(tpr - delta, 0.0) / fpr)
        complement = np.log(np.maximum(1 - fpr - delta, 0.0) / (1 - tpr))
    best = np.fmax(direct, complement)
    return np.asarray(np.maximum(np.nan_to_num(best, nan=0.0, posinf=np.inf), 0.0), np.float64)


def two_world_ceiling(trials: int, delta: float, confidence: float = 0.95) -> float:
    """The largest bound a two-world audit of `trials` trials a world can show: a test
    right on every trial of the bounding halves (`trials` − ⌊`trials`/2⌋ a world). An ε
    above it cannot be refuted at these trials, however much a run leaks."""
    bounding = trials - trials // 2
    return float(two_world_epsilon(bounding, bounding, 0, bounding, delta, confidence))


def one_run_p_value(
    canaries: int, guesses: int, correct: int, epsilon: float, delta: float
) -> float:
    """P[at least `correct` of `guesses` right] for an (ε, δ)-DP run with `canaries`
    canaries each included independently with probability 1/2: Steinke, Nasr and
    Jagielski, "Privacy auditing with one (1) training run" (NeurIPS 2023), Theorem 5.2,
    computed as in their Appendix D (Algorithm 2): the binomial tail of ε-randomised
    response, β = P[Binomial(r, q) ≥ v] with q = e^ε/(1 + e^ε), plus 2mδ·α, where α is
    the largest mean P[v − i ≤ Binomial(r, q) < v] / i over i = 1..v."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(
            f"need 0 ≤ correct ≤ guesses ≤ canaries, got {correct}, {guesses}, {canaries}"
        )
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need ε ≥ 0 and 0 ≤ δ ≤ 1, got {epsilon}, {delta}")
    q = 1 / (1 + math.exp(-epsilon))
    beta = float(stats.binom.sf(correct - 1, guesses, q))
    i = np.arange(1, correct + 1)
    alpha = float(np.max(np.cumsum(stats.binom.pmf(correct - i, guesses, q)) / i, initial=0.0))
    return min(beta + alpha * delta * 2 * canaries, 1.0)


def one_run_epsilon(
    canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """The largest ε whose p-value (`one_run_p_value`) is below 1 − `confidence`: every
    smaller ε is refuted (the p-value rises with ε; 0 if even ε = 0 is not)."""
    _check(delta, confidence)
    level = 1 - confidence

    def excess(epsilon: float) -> float:
        return one_run_p_value(canaries, guesses, correct, epsilon, delta) - level

    if excess(0.0) >= 0:
        return 0.0
    high = 1.0
    while excess(high) < 0:
        high *= 2
    tolerance = 1e-6
    root: float = optimize.brentq(excess, 0.0, high, xtol=tolerance)
    return max(root - tolerance, 0.0)  # the solver's root may sit just past the crossing


def _check(delta: float, confidence: float) -> None:
    if not 0 <= delta < 1 or not 0 < confidence < 1:
        raise ValueError(f"need 0 ≤ δ < 1 and 0 < confidence < 1, got {delta}, {confidence}")
