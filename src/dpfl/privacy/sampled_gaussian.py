"""One Poisson-sampled Gaussian step, analysed as `dp_accounting` does, on arrays.

`dp_accounting` evaluates this step, the one DP-SGD repeats, point by point in Python: its
PLD inverts the privacy loss at each of ~10⁵ grid points, its RDP sums a series per Rényi
order (dpfl uses 421), which takes seconds a step (benchmarks/README.md). Kerkouche's 314
hospitals each have their own q, and calibration probes many σ. Here are the same formulas
in the same order of operations, evaluated on arrays: the tests compare every value with
`dp_accounting`'s, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from dp_accounting.pld import privacy_loss_mechanism
from scipy import special

from dpfl.errors import InternalError

ADD = privacy_loss_mechanism.AdjacencyType.ADD
REMOVE = privacy_loss_mechanism.AdjacencyType.REMOVE


class Loss(privacy_loss_mechanism.GaussianPrivacyLoss):  # type: ignore[misc]
    """`GaussianPrivacyLoss` (add or remove, q < 1) whose δ(ε) takes the PLD's whole grid
    of ε at once; everything else, bounds and tails included, is `dp_accounting`'s."""

    def get_delta_for_epsilon(self, epsilon: Any) -> Any:
        if np.ndim(epsilon) == 0:
            return super().get_delta_for_epsilon(epsilon)
        eps = np.asarray(epsilon, dtype=float)
        deltas = np.zeros_like(eps)
        q = self.sampling_prob
        if self.adjacency_type is ADD:
            inverse = eps < -math.log1p(-q)
        else:
            inverse = eps > math.log1p(-q)
            deltas[~inverse] = -np.expm1(eps[~inverse])
        cutoffs = self._inverse_losses(eps[inverse])
        deltas[inverse] = self.mu_upper_cdf(cutoffs) - np.exp(
            eps[inverse] + self.mu_lower_log_cdf(cutoffs)
        )
        return np.clip(deltas, 0, 1)

    def _inverse_losses(self, losses: np.ndarray) -> np.ndarray:
        """`inverse_privacy_loss` at each of `losses`: the loss without sampling is
        ±log(exp(±ε)/q + 1 - 1/q) (`common.log_a_times_exp_b_plus_c`), then inverted."""
        q, s, variance = self.sampling_prob, self.sensitivity, self._standard_deviation**2
        add = self.adjacency_type is ADD
        b = -losses if add else losses
        a, c = 1 / q, 1 - 1 / q
        d = b + np.log(a)
        log_minus_c = np.log(-c)
        if np.any(log_minus_c >= d):
            raise InternalError("a privacy loss lies outside the sampled mechanism's range")
        unsampled = np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(log_minus_c - d)))
        if add:
            unsampled = -unsampled
        bound = -math.log(1 - q) if add else math.log(1 - q)
        # at the bound (by `math.isclose`, as dp_accounting tests it) the inverse is ±∞
        at_bound = np.abs(losses - bound) <= 1e-9 * np.maximum(np.abs(losses), abs(bound))
        unsampled = np.where(at_bound, math.inf if add else -math.inf, unsampled)
        cutoffs: np.ndarray = -0.5 * s - unsampled * variance / s
        return cutoffs + s if add else cutoffs


def rdp(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Rényi DP of one step at each order (add/remove): `dp_accounting`'s
    `_compute_rdp_poisson_subsampled_gaussian`, log A_α/(α − 1) with A_α from Mironov,
    Talwar & Zhang 2019 (a finite sum at integer α, §3.3's two series otherwise)."""
    orders = np.asarray(orders, dtype=float)
    if q == 0:
        return np.zeros_like(orders)
    if sigma == 0:
        return np.full_like(orders, np.inf)
    if q == 1.0:
        full: np.ndarray = orders / (2 * sigma**2)
        return full
    if sigma**2 == 0:  # dp_accounting divides by it in Python floats, and raises
        raise ZeroDivisionError(f"σ² underflows to 0 at σ = {sigma!r}")
    integer = orders == np.floor(orders)
    log_a = np.empty_like(orders)
    log_a[integer] = _log_a_integer(q, sigma, orders[integer])
    log_a[~integer] = _log_a_fractional(q, sigma, orders[~integer])
    per_order: np.ndarray = log_a / (orders - 1)
    return per_order


def _log_a_integer(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log A_α = log Σ_{i≤α} C(α, i) q^i (1 − q)^(α−i) exp((i² − i)/2σ²), added up from
    i = 0 as `dp_accounting` does (log C from one table of log k!, the same values)."""
    if not orders.size:
        return orders
    log_factorial = special.gammaln(np.arange(int(orders.max()) + 1, dtype=float) + 1)
    sums = []
    for alpha in orders.astype(int):
        i = np.arange(alpha + 1)
        k = i.astype(float)
        log_comb = log_factorial[alpha] - log_factorial[i] - log_factorial[alpha - i]
        terms = (
            log_comb
            + k * math.log(q)
            + (alpha - k) * math.log1p(-q)
            + (k * k - k) / (2 * (sigma**2))
        )
        sums.append(np.logaddexp.reduce(terms))
    return np.array(sums)


_FIRST_TERMS = 32
"""Terms of the fractional-order series tried first: nearly every order converges
within them; the others are summed to `dp_accounting`'s limit."""

_MAX_TERMS = 1000
"""`dp_accounting`'s `_MAX_STEPS_LOG_A_FRAC`: a series not converged by then gives ∞."""


def _log_a_fractional(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    log_a = _series(q, sigma, orders, _FIRST_TERMS)
    longer = np.isnan(log_a)
    if longer.any():
        log_a[longer] = _series(q, sigma, orders[longer], _MAX_TERMS)
    return np.where(np.isnan(log_a), np.inf, log_a)


def _series(q: float, sigma: float, orders: np.ndarray, count: int) -> np.ndarray:
    """The two series' sum over (−∞, z₀] and [z₀, ∞), stopped where `dp_accounting`
    stops: at the first term where both fall and lie 30 nats below the running total;
    NaN where that does not happen within `count` terms."""
    i = np.arange(count, dtype=float)
    alpha = orders[:, None]
    j = alpha - i
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    log1mq = math.log1p(-q)
    log_coef = special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(j + 1)
    log_t0 = log_coef + i * math.log(q) + j * log1mq
    log_t1 = log_coef + j * math.log(q) + i * log1mq
    log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
    log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
    log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
    log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
    total = np.logaddexp(
        np.logaddexp.accumulate(log_s0, axis=1), np.logaddexp.accumulate(log_s1, axis=1)
    )
    falling = np.zeros_like(log_s0, dtype=bool)
    falling[:, 1:] = (log_s0[:, 1:] < log_s0[:, :-1]) & (log_s1[:, 1:] < log_s1[:, :-1])
    stops = falling & (np.maximum(log_s0, log_s1) < total - 30)
    first = np.argmax(stops, axis=1)
    at_stop = total[np.arange(len(orders)), first]
    return np.where(stops.any(axis=1), at_stop, np.nan)


def _log_erfc(x: np.ndarray) -> np.ndarray:
    result: np.ndarray = math.log(2) + special.log_ndtr(-x * 2**0.5)
    return result
