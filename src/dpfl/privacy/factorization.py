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
  McMahan et al., "Hassle-free", 2024): C's coefficients are a sum of d decaying
  exponentials, so C⁻¹ z is a recursive filter with d buffers, of any length of run.

`prefix_rmse` is ‖A C⁻¹‖_F / √n, the root-mean-square error of the noisy prefix sums per
unit of noise std; the privacy calibration (the sensitivity of C) is the caller's.
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
