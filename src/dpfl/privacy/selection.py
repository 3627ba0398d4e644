"""The random number of candidate runs of private hyperparameter selection.

Papernot & Steinke (ICLR 2022) bound the privacy of "run a random number K of DP
trainings, release only the best" when K is drawn from a truncated negative binomial
(shape η > 0; η = 0 the logarithmic, η = 1 the geometric distribution) or a Poisson
distribution (`shape = inf`). The bound holds for K drawn from exactly that law, so the
draw lives here, beside the event it declares (`events.tuned`), and uses the very γ
that `dp_accounting`'s accountant derives from (mean, shape).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

__all__ = ["probabilities", "repetitions"]


def _gamma(mean: float, shape: float) -> float:
    """γ of the truncated negative binomial of this mean, as the accountant computes it
    (its private helper: the sampler must use the law the accountant analyses)."""
    return float(rdp_privacy_accountant._gamma_truncated_negative_binomial(shape, mean))


def repetitions(mean: float, shape: float, rng: np.random.Generator) -> int:
    """K, the number of candidate runs: Poisson(mean) for `shape = inf` (K may be 0:
    then nothing is released), else the truncated negative binomial (K ≥ 1)."""
    if not (math.isfinite(mean) and mean >= 1) or math.isnan(shape) or shape < 0:
        raise ValueError(f"need mean ≥ 1 and shape ≥ 0 (inf: Poisson), got {mean}, {shape}")
    if math.isinf(shape):
        return int(rng.poisson(mean))
    gamma = _gamma(mean, shape)
    if gamma >= 1.0:
        return 1
    if shape == 0:  # logarithmic: P[K = k] ∝ (1 − γ)^k / k
        return int(rng.logseries(1.0 - gamma))
    while True:  # negative binomial P[K = k] ∝ C(k + η − 1, k) (1 − γ)^k, conditioned on K ≥ 1
        k = int(rng.negative_binomial(shape, gamma))
        if k >= 1:
            return k


def probabilities(mean: float, shape: float, ks: np.ndarray) -> np.ndarray:
    """P[K = k] of the declared law at each k (for tests and for showing the law)."""
    ks = np.asarray(ks, dtype=np.float64)
    log_factorial = np.array([math.lgamma(k + 1) for k in ks])
    if math.isinf(shape):
        log_p = ks * math.log(mean) - mean - log_factorial
    else:
        gamma = _gamma(mean, shape)
        if shape == 0:
            log_p = ks * math.log1p(-gamma) - np.log(ks) - math.log(-math.log(gamma))
        else:
            log_binomial = np.array([math.lgamma(k + shape) for k in ks]) - log_factorial
            log_p = (
                log_binomial
                - math.lgamma(shape)
                + ks * math.log1p(-gamma)
                + shape * math.log(gamma)
                - math.log1p(-(gamma**shape))
            )
    result: np.ndarray = np.exp(log_p)
    return result
