"""Strategy matrices of correlated-noise (matrix-factorisation, DP-FTRL) mechanisms.

Training releases the running sums of its clipped gradients, the prefix-sum workload
A x (A: n×n lower-triangular ones). DP-SGD adds independent noise to every step, and its
error in the prefix sums grows as √n. A matrix mechanism factors A = B C with C
lower-triangular, releases C x + z and adds the correlated noise C⁻¹ z to the gradients,
so the sums carry A C⁻¹ z: with a good C, noise added at one step is partly taken back
at the next ones, and the error per unit of noise grows only as log n
(Fichtenberger, Henzinger & Upadhyay 2023, "Constant matters": C = A^{1/2}). The two
strategies here keep C⁻¹ z cheap to generate step by step:

* `BandedToeplitz` (banded MF; Choquette-Choo, McMahan, Rush & Thakurta, "Amplified
  banded matrix factorization", NeurIPS 2023; McKenna, "Scaling up the banded matrix
  factorization mechanism", 2024): C is Toeplitz with b bands, so a record's
  participations b steps apart touch disjoint rows of C x and Poisson sampling still
  amplifies (their Theorem 4). The noise needs b − 1 past noise vectors.
* `BufferedToeplitz` (BLT; Dvijotham, McMahan, Pillutla, Steinke & Thakurta, "Efficient
  and near-optimal noise generation for streaming differential privacy", FOCS 2024;
  McMahan, Xu & Zhang, "A hassle-free algorithm for private learning in practice", 2024):
  C's coefficients are a sum of d decaying exponentials, so C⁻¹ z is a recursive filter
  with d buffers, of any length of run, and no amplification is claimed.

`prefix_rmse` is ‖A C⁻¹‖_F / √n, the root-mean-square error of the noisy prefix sums per
unit of noise std; the privacy calibration is the caller's (a banded C has unit column
norm; `BufferedToeplitz.sensitivity_squared` gives the BLT's).
Everything is float64 NumPy/SciPy and deterministic.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, signal

from dpfl.privacy.errors import PrivacyParameterError

_Array = np.ndarray
_UNSTABLE = 1e300
"""The loss the optimisers see where 1/C(x) is unstable: far above any real loss, so the
line search steps back into the stable region."""


def _impulse(n: int) -> _Array:
    out = np.zeros(n)
    out[0] = 1.0
    return out


def _is_stable(a: _Array) -> bool:
    """Whether every root of a(x) = Σ a_k x^k lies outside the unit circle, so that the
    filter 1/a(x) (`lfilter([1], a, …)`) decays. The Schur–Cohn step-down recursion:
    stable iff every reflection coefficient lies in (−1, 1); O(len(a)²), no root finding."""
    if not np.all(np.isfinite(a)) or a[0] == 0:
        return False
    a = np.trim_zeros(np.asarray(a, dtype=np.float64) / a[0], "b")
    while len(a) > 1:
        k = a[-1]
        if not abs(k) < 1:
            return False
        a = (a[:-1] - k * a[-1:0:-1]) / (1 - k * k)
    return True


def _prefix_loss(inverse: _Array) -> float:
    """‖A C⁻¹‖_F² for the n×n lower-triangular Toeplitz C⁻¹ of first column `inverse`:
    A C⁻¹ is Toeplitz with coefficients e = cumsum(inverse), e_k on n − k diagonal entries."""
    e = np.cumsum(inverse)
    return float(np.dot(np.arange(len(e), 0, -1), e * e))


def _square_root_coefficients(n: int) -> _Array:
    """The first n coefficients of A^{1/2} = (1 − x)^{−1/2}: r_k = binom(2k, k) / 4^k."""
    k = np.arange(1, n)
    return np.concatenate(([1.0], np.cumprod((2 * k - 1) / (2 * k))))


def _check_steps(name: str, value: int, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise PrivacyParameterError(f"{name} must be an integer >= {least}, got {value!r}")


def _frozen(values: _Array, name: str) -> _Array:
    array = np.array(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)):
        raise PrivacyParameterError(f"{name} must be a non-empty 1-D array of finite numbers")
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class BandedToeplitz:
    """C lower-triangular Toeplitz with b bands: C[i, i − j] = c_j for 0 ≤ j < b.

    ‖c‖₂ = 1, so every column of C has norm ≤ 1 (the last ones are truncated): a record
    taking part at most once in any b consecutive steps changes C x by at most 1, one
    disjoint block of rows per participation. c_0 > 0 and 1/c(x) is stable, so the noise
    C⁻¹ z stays bounded. Band 1 is C = I: independent noise.
    """

    coefficients: _Array

    def __post_init__(self) -> None:
        c = _frozen(self.coefficients, "banded Toeplitz coefficients")
        if not c[0] > 0:
            raise PrivacyParameterError(f"banded Toeplitz c_0 must be > 0, got {c[0]!r}")
        if abs(float(np.linalg.norm(c)) - 1) > 1e-12:
            raise PrivacyParameterError(
                f"banded Toeplitz coefficients must have L2 norm 1, got {np.linalg.norm(c)!r}"
            )
        if not _is_stable(c):
            raise PrivacyParameterError(
                "banded Toeplitz coefficients have a root of c(x) inside the unit circle: "
                "the noise C⁻¹ z would grow without bound"
            )
        object.__setattr__(self, "coefficients", c)

    @property
    def band(self) -> int:
        return len(self.coefficients)

    @classmethod
    def optimal(cls, steps: int, band: int) -> BandedToeplitz:
        """The b-banded C minimising ‖A C⁻¹‖_F² ‖c‖² for `steps` steps (the mean squared
        error of the prefix sums at unit sensitivity); cached."""
        _check_steps("steps", steps)
        _check_steps("band", band)
        if band > steps:
            raise PrivacyParameterError(f"band must be <= steps ({steps}), got {band}")
        return _optimal_banded(int(steps), int(band))

    def inverse_coefficients(self, n: int) -> _Array:
        """d, the first n coefficients of C⁻¹: the noise is
        w_t = (z_t − Σ_{j≥1} c_j w_{t−j}) / c_0."""
        _check_steps("n", n)
        return np.asarray(signal.lfilter([1.0], self.coefficients, _impulse(n)))

    def prefix_rmse(self, steps: int) -> float:
        """‖A C⁻¹‖_F / √steps: the RMS error of the noisy prefix sums per unit noise std."""
        return math.sqrt(_prefix_loss(self.inverse_coefficients(steps)) / steps)


def _banded_log_loss(tail: _Array, steps: int) -> tuple[float, _Array]:
    """log(‖A C⁻¹‖_F² ‖c‖²) at c = (1, tail) and its gradient in tail.

    With d = C⁻¹'s coefficients and e = cumsum(d), F = Σ_k (n − k) e_k². ∂d_k/∂c_j =
    −g_{k−j}, g = d ∗ d (the impulse response of 1/c²), so ∂F/∂c_j = −Σ_k h_k g_{k−j}
    with h_k = ∂F/∂d_k = Σ_{m≥k} 2 (n − m) e_m.
    """
    c = np.concatenate(([1.0], tail))
    if not _is_stable(c):
        return _UNSTABLE, np.zeros_like(tail)
    d = signal.lfilter([1.0], c, _impulse(steps))
    e = np.cumsum(d)
    weighted = np.arange(steps, 0, -1) * e
    f = float(np.dot(weighted, e))
    h = np.cumsum(2 * weighted[::-1])[::-1]
    g = signal.lfilter([1.0], c, d)
    lags = steps - 1 - np.arange(1, len(c))
    grad_f = -signal.fftconvolve(h[::-1], g)[lags]
    norm2 = float(np.dot(c, c))
    return math.log(f) + math.log(norm2), grad_f / f + 2 * c[1:] / norm2


@functools.lru_cache(maxsize=256)
def _optimal_banded(steps: int, band: int) -> BandedToeplitz:
    start = _square_root_coefficients(band)
    if band > 1:
        found = optimize.minimize(
            _banded_log_loss,
            start[1:],
            args=(steps,),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 1000, "ftol": 1e-13, "gtol": 1e-9},
        )
        start = np.concatenate(([1.0], found.x))
    return BandedToeplitz(start / np.linalg.norm(start))


def _comb(steps: int, separation: int) -> _Array:
    out = np.zeros(steps)
    out[::separation] = 1.0
    return out


def _buffered(weights: _Array, rates: _Array, x: _Array) -> _Array:
    """M x for the BLT M(x) = 1 + Σ w_i x / (1 − r_i x): d first-order recursions, exact
    to rounding even with rates near 1, where the product polynomials of the same filter
    cancel (C = P / Q from them was off by 1e-6 relative over 10,000 steps for θ =
    0.9, 0.99, 0.999, 0.9999)."""
    out = np.array(x, dtype=np.float64)
    for weight, rate in zip(weights, rates, strict=True):
        out += weight * signal.lfilter([0.0, 1.0], [1.0, -rate], x)
    return out


def _inverse_buffers(omega: _Array, theta: _Array) -> tuple[_Array, _Array]:
    """(ω̂, λ) with C⁻¹(x) = 1 + Σ ω̂_j x / (1 − λ_j x): C(1/λ) = 1 + Σ ω_i / (λ − θ_i) = 0
    at the d eigenvalues of diag(θ) − ω 1ᵀ (real, one below θ_1 and one between each
    consecutive θ_i), with residues ω̂_j = −1 / Σ_i ω_i / (λ_j − θ_i)²."""
    rates = np.sort(np.linalg.eigvals(np.diag(theta) - omega[:, np.newaxis]).real)
    with np.errstate(divide="ignore"):  # two equal θ: λ = θ, a buffer of weight 0
        weights = -1 / np.sum(omega / (rates[:, np.newaxis] - theta) ** 2, axis=1)
    return weights, rates


def _blt_problem(omega: _Array, theta: _Array) -> str | None:
    """What makes (ω, θ) no valid BLT (see `BufferedToeplitz`), or None."""
    if omega.shape != theta.shape:
        return f"BLT omega and theta must have the same length, got {omega.size} and {theta.size}"
    if not np.all(omega > 0) or not omega.sum() <= 1:
        return f"BLT omega must be > 0 with sum <= 1 (C non-increasing), got {omega.tolist()}"
    if not np.all((theta > 0) & (theta < 1)):
        return f"BLT theta must lie in (0, 1), got {theta.tolist()}"
    rates = _inverse_buffers(omega, theta)[1]
    if not np.all(np.isfinite(rates) & (np.abs(rates) < 1)):
        return (
            "BLT has a zero of C(x) on or inside the unit circle (float rounding): "
            "the noise C⁻¹ z would not decay"
        )
    return None


@dataclass(frozen=True, eq=False)
class BufferedToeplitz:
    """C lower-triangular Toeplitz with c_0 = 1 and c_k = Σ_i ω_i θ_i^{k−1} (k ≥ 1): d
    buffers, each a running sum decayed by θ_i, make C x and C⁻¹ z for any length of run.

    Required: ω_i > 0, 0 < θ_i < 1 and Σ ω_i ≤ 1, so that c_0 = 1 ≥ c_1 = Σ ω_i and the
    coefficients are positive and non-increasing. That is what makes the comb 0, b, 2b, …
    the worst participation pattern with separation ≥ b (Kalinin & Lampert, "Banded square
    root matrix factorization for differentially private model training", NeurIPS 2024,
    Theorem 2; used for BLTs by McMahan, Xu & Zhang, "A hassle-free algorithm for private
    learning in practice: don't use tree aggregation, use BLTs", 2024). It also keeps C(x)'s
    zeros outside the unit disk (there Re x/(1 − θx) ≥ −1/(1 + θ)), so the noise filter
    decays; its rates are still checked, for float rounding at the edge.
    """

    omega: _Array
    theta: _Array

    def __post_init__(self) -> None:
        omega = _frozen(self.omega, "BLT omega")
        theta = _frozen(self.theta, "BLT theta")
        problem = _blt_problem(omega, theta)
        if problem:
            raise PrivacyParameterError(problem)
        object.__setattr__(self, "omega", omega)
        object.__setattr__(self, "theta", theta)

    @property
    def buffers(self) -> int:
        return len(self.omega)

    @classmethod
    def optimal(cls, steps: int, separation: int, buffers: int = 4) -> BufferedToeplitz:
        """The BLT minimising ‖A C⁻¹‖_F² S(steps) (the mean squared error of the prefix
        sums at unit sensitivity, for participations `separation` apart); cached."""
        _check_steps("steps", steps)
        _check_steps("separation", separation)
        _check_steps("buffers", buffers)
        return _optimal_blt(int(steps), int(separation), int(buffers))

    def coefficients(self, n: int) -> _Array:
        """c, the first n coefficients of C."""
        _check_steps("n", n)
        return _buffered(self.omega, self.theta, _impulse(n))

    def inverse_buffers(self) -> tuple[_Array, _Array]:
        """(ω̂, λ) with C⁻¹(x) = 1 + Σ_j ω̂_j x / (1 − λ_j x): the inverse of a BLT is a BLT,
        so C⁻¹ z is d first-order recursions (s_j ← λ_j s_j + z, w = z + Σ ω̂_j s_j),
        which stay exact to rounding in float32. The same filter as one product
        polynomial (`lfilter(Q, P)`) does not: its rates near 1 cancel, and in float32 its
        prefix sums were off by half their size after 10,000 steps."""
        return _inverse_buffers(self.omega, self.theta)

    def sensitivity_squared(self, steps: int, separation: int) -> _Array:
        """Entry T − 1: ‖C 1_S‖² over the first T steps for S = {0, b, 2b, …} (b =
        `separation`), the worst pattern of participations at least b apart, every phase
        included (the class docstring says why), with unit contributions all pointing one
        way (C ≥ 0: no cancellation can do worse). O(steps · d)."""
        _check_steps("steps", steps)
        _check_steps("separation", separation)
        column = _buffered(self.omega, self.theta, _comb(steps, separation))
        return np.asarray(np.cumsum(column * column))

    def prefix_rmse(self, steps: int) -> float:
        """‖A C⁻¹‖_F / √steps: the RMS error of the noisy prefix sums per unit noise std."""
        _check_steps("steps", steps)
        inverse = _buffered(*_inverse_buffers(self.omega, self.theta), _impulse(steps))
        return math.sqrt(_prefix_loss(inverse) / steps)


def _blt_parameters(x: _Array) -> tuple[_Array, _Array]:
    """(ω, θ) from unconstrained x = (u, logit θ): ω_i = e^{u_i} / (1 + Σ_j e^{u_j}), so
    every x is a valid BLT (ω > 0, Σ ω < 1, 0 < θ < 1) but for float rounding at the edges,
    which `_blt_problem` catches."""
    u, logit = np.split(x, 2)
    top = max(0.0, float(u.max()))
    weights = np.exp(u - top)
    return weights / (math.exp(-top) + weights.sum()), 1 / (1 + np.exp(-logit))


def _blt_log_loss(x: _Array, steps: int, separation: int) -> float:
    """log(‖A C⁻¹‖_F² S(steps)), in the buffers' own (well-conditioned) form."""
    omega, theta = _blt_parameters(x)
    if _blt_problem(omega, theta):
        return _UNSTABLE
    weights, rates = _inverse_buffers(omega, theta)
    column = _buffered(omega, theta, _comb(steps, separation))
    inverse = _buffered(weights, rates, _impulse(steps))
    return math.log(_prefix_loss(inverse)) + math.log(float(np.dot(column, column)))


@functools.lru_cache(maxsize=256)
def _optimal_blt(steps: int, separation: int, buffers: int) -> BufferedToeplitz:
    """Starts from time scales 1/(1 − θ_i) = (steps + 1)^{i/d}, i = 1..d, log-spaced up to
    the run's length, with ω_i ∝ √(1 − θ_i) and Σ ω = 1/2: a sum of exponentials that
    discretises k^{−1/2} ∝ ∫ t^{−1/2} e^{−kt} dt, the decay of A^{1/2}'s coefficients
    (whose c_1 is 1/2)."""
    gap = float(steps + 1) ** -(np.arange(1, buffers + 1) / buffers)
    weights = np.sqrt(gap) / np.sqrt(gap).sum()
    start = np.concatenate((np.log(weights), np.log((1 - gap) / gap)))  # Σ ω = 1/2
    found = optimize.minimize(_blt_log_loss, start, args=(steps, separation), method="L-BFGS-B")
    return BufferedToeplitz(*_blt_parameters(found.x))
