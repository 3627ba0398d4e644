"""The exponential mechanism for the quantiles of one hospital's records: Exp (Smith 2011)
for one quantile and JointExp (Gillenwater, Joseph & Kulesza, "Differentially Private
Quantiles", ICML 2021, Algorithm 2) for several at once, each ε-DP (pure).

Neighbouring datasets differ by one record added or removed, so the record count n is
private too (a unit of up to k records, a patient, is k such steps: pass ε/k, group
privacy). The values, clipped to the public [low, high], cut it into the intervals
between consecutive order statistics (low and high the outer ends); an output inside the
interval with r values below it has rank r. Intervals of ties have width 0, hence
probability 0, and are dropped before any logarithm is taken. Weights stay in log space
and every sum is an exact log-sum-exp (no FFT, unlike the authors' `dp_multiq`), so that
the smallest probabilities, which the ε-DP ratio is about, are as accurate as the largest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy.special import log_ndtr, logsumexp, ndtr

from dpfl.analytics.mechanisms import Figure, Records

if TYPE_CHECKING:
    from dpfl.local.noise import NoiseSource


@dataclass(frozen=True)
class _Intervals:
    """The intervals of positive width: ends, and how many values lie below each."""

    lefts: np.ndarray
    rights: np.ndarray
    ranks: np.ndarray
    n: int


def _intervals(
    x: ArrayLike, ps: Sequence[float], low: float, high: float, epsilon: float
) -> _Intervals:
    """The inputs checked, and the intervals between the clipped, sorted values."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive number, got {epsilon}")
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"the public bounds need low < high, got [{low}, {high}]")
    probs = np.asarray(ps, dtype=np.float64)
    if probs.size == 0 or not np.all((probs > 0) & (probs < 1)):
        raise ValueError(f"quantile levels must lie in (0, 1), got {list(probs)}")
    if np.any(np.diff(probs) <= 0):
        raise ValueError(f"quantile levels must be strictly increasing, got {list(probs)}")
    values = np.asarray(x, dtype=np.float64).ravel()
    if np.isnan(values).any():
        raise ValueError("the values hold NaN: drop or impute missing values first")
    edges = np.concatenate(([low], np.sort(np.clip(values, low, high)), [high]))
    keep = np.diff(edges) > 0
    return _Intervals(edges[:-1][keep], edges[1:][keep], np.flatnonzero(keep), len(values))


def _gumbel_argmax(logits: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn with probability ∝ exp(logits) (the Gumbel-max trick)."""
    return int(np.argmax(logits + rng.gumbel(size=logits.shape)))


def _quantile_log_probabilities(
    x: ArrayLike, p: float, low: float, high: float, epsilon: float
) -> tuple[_Intervals, np.ndarray]:
    """Exp's intervals and the log-probability that it draws each."""
    cut = _intervals(x, [p], low, high, epsilon)
    exponent = epsilon / (2 * max(p, 1 - p))
    logits = np.log(cut.rights - cut.lefts) - exponent * np.abs(cut.ranks - p * cut.n)
    return cut, logits - logsumexp(logits)


def exponential_quantile(
    x: ArrayLike, p: float, low: float, high: float, epsilon: float, rng: np.random.Generator
) -> float:
    """The p-quantile of `x` by the exponential mechanism on [low, high], ε-DP.

    An output of rank r has utility u = −|r − p·n| (its rank error). Adding or removing
    one record moves r by 0 or 1 and p·n by p, so u moves by at most Δ = max(p, 1 − p).
    u is not monotone (the record may move it either way), so the standard exponent
    ε·u/(2Δ) is used: the density at an output is ∝ exp(ε·u/(2Δ)), an interval's
    probability ∝ width·exp(ε·u/(2Δ)), and the output is uniform in the drawn interval.
    The density ratio between neighbours is at most e^{ε/2} from u times e^{ε/2} from the
    normaliser. This is JointExp with one quantile exactly (Δ_JointExp = 2·max(p, 1 − p)
    on a utility counting the error twice), and for p = 1/2 it is exp(−ε·|r − n/2|).
    """
    cut, log_probs = _quantile_log_probabilities(x, p, low, high, epsilon)
    i = _gumbel_argmax(log_probs, rng)
    return float(rng.uniform(cut.lefts[i], cut.rights[i]))


def rank_error_bound(
    x: ArrayLike, p: float, low: float, high: float, epsilon: float, beta: float
) -> float:
    """A rank error that `exponential_quantile` exceeds with probability at most β.

    For any level e, let W(e) be the total width of the intervals of rank error ≤ e. They
    carry mass ≥ W(e)·exp(−ε·e/(2Δ)), every output of error ≥ e + τ at most
    (high − low)·exp(−ε·(e + τ)/(2Δ)), so P(error ≥ e + τ) ≤ (high − low)/W(e)·exp(−ε·τ/(2Δ))
    and τ = (2Δ/ε)·ln((high − low)/(W(e)·β)) gives probability ≤ β; the bound is the least
    e + τ over e. It reads the records (W and the errors are theirs), so it is a fact for
    testing and planning, never a figure to publish (it is not differentially private).
    With ties, an interval near rank p·n may have width 0, so the least error can be large.
    """
    if not 0 < beta < 1:
        raise ValueError(f"beta must lie in (0, 1), got {beta}")
    cut, _ = _quantile_log_probabilities(x, p, low, high, epsilon)
    errors = np.abs(cut.ranks - p * cut.n)
    order = np.argsort(errors)
    within = np.cumsum((cut.rights - cut.lefts)[order])
    tau = 2 * max(p, 1 - p) / epsilon * np.log((high - low) / (within * beta))
    return float(np.min(errors[order] + tau))


@dataclass(frozen=True)
class _Joint:
    """JointExp's tables for one dataset: its intervals, the exponent's scale, each gap's
    target count, and log_alpha[j, i, k], the log-mass of outputs 1..j+1 with output j+1
    and exactly the k before it in interval i (the dynamic programme's state)."""

    cut: _Intervals
    scale: float
    targets: np.ndarray
    log_alpha: np.ndarray

    def log_gap(self, gap: int, counts: np.ndarray) -> np.ndarray:
        """log φ: the exponent on gap `gap` holding `counts` values."""
        distance: np.ndarray = np.abs(counts - self.targets[gap])
        return -self.scale * distance

    def last_step(self) -> np.ndarray:
        """The log-mass of (interval, repeats) for the last output, high ending the gap."""
        to_high = self.log_gap(len(self.targets) - 1, self.cut.n - self.cut.ranks)
        last: np.ndarray = self.log_alpha[-1] + np.expand_dims(to_high, 1)
        return last


def _window_logsumexp(v: np.ndarray, width: int) -> np.ndarray:
    """out[r] = log Σ exp(v[r − width], …, v[r − 1]) (fewer near the start), by blocks of
    `width`: each window is a block's suffix plus the next block's prefix (van Herk)."""
    if width == 0:
        return np.full(len(v), -np.inf)
    padded = np.concatenate((np.full(width, -np.inf), v))
    blocks = np.full(-(-len(padded) // width) * width, -np.inf)
    blocks[: len(padded)] = padded
    grid = blocks.reshape(-1, width)
    prefix = np.logaddexp.accumulate(grid, axis=1).ravel()
    suffix = np.logaddexp.accumulate(grid[:, ::-1], axis=1)[:, ::-1].ravel()
    start = np.arange(len(v))
    crosses = start % width != 0
    out = suffix[start]
    out[crosses] = np.logaddexp(out[crosses], prefix[start[crosses] + width - 1])
    return out


def _log_step(cut: _Intervals, log_from: np.ndarray, scale: float, target: float) -> np.ndarray:
    """log Σ_{i' < i} exp(log_from[i'] − scale·|r_i − r_i' − target|) for every interval i,
    in O(n) over the ranks: counts c ≥ ⌈target⌉ weigh exp(−scale·(c − target)), a prefix
    sum; fewer weigh exp(−scale·(target − c)), a sliding window. Both add positive terms
    only, so that every entry is exact to rounding, however small."""
    ranks = np.arange(cut.n + 1)
    dense = np.full(cut.n + 1, -np.inf)
    dense[cut.ranks] = log_from
    split = max(1, math.ceil(target))
    far = np.full(cut.n + 1, -np.inf)
    prefix = np.logaddexp.accumulate(dense + scale * ranks)
    far[split:] = prefix[: cut.n + 1 - split] - scale * (ranks[split:] - target)
    near = _window_logsumexp(dense - scale * ranks, split - 1) + scale * (ranks - target)
    step: np.ndarray = np.logaddexp(far, near)[cut.ranks]
    return step


def _joint_tables(
    x: ArrayLike, ps: Sequence[float], low: float, high: float, epsilon: float
) -> _Joint:
    """JointExp's forward pass (Gillenwater et al. 2021, Algorithm 2), in log space."""
    cut = _intervals(x, ps, low, high, epsilon)
    gaps = np.diff(np.concatenate(([0.0], ps, [1.0])))
    scale = epsilon / (2 * 2 * (1 - gaps.min()))
    m, log_widths = len(gaps) - 1, np.log(cut.rights - cut.lefts)
    joint = _Joint(cut, scale, gaps * cut.n, np.full((m, len(cut.ranks), m), -np.inf))
    log_alpha = joint.log_alpha
    log_alpha[0, :, 0] = log_widths + joint.log_gap(0, cut.ranks)
    for j in range(1, m):
        entering = _log_step(cut, logsumexp(log_alpha[j - 1], axis=1), scale, joint.targets[j])
        log_alpha[j, :, 0] = log_widths + entering
        # output j+1 joins the k before it in interval i: gap of 0 values, and the sorted
        # outputs in one interval of width w fill w^(k+1)/(k+1)!
        staying = (log_widths + joint.log_gap(j, np.zeros(1)))[:, None]
        log_alpha[j, :, 1:] = staying + log_alpha[j - 1, :, :-1] - np.log(np.arange(2, m + 1))
    return joint


def _joint_sample_intervals(joint: _Joint, rng: np.random.Generator) -> np.ndarray:
    """Each output's interval, drawn backwards from the last output (the DP's sampling)."""
    m = joint.log_alpha.shape[0]
    chosen = np.empty(m, dtype=np.int64)
    logits, j = joint.last_step(), m - 1
    while j >= 0:
        i, k = divmod(_gumbel_argmax(logits.ravel(), rng), m)
        chosen[j - k : j + 1] = i
        j -= k + 1
        if j >= 0:
            counts = joint.cut.ranks[i] - joint.cut.ranks
            to_next = np.where(counts > 0, joint.log_gap(j + 1, counts), -np.inf)
            logits = joint.log_alpha[j] + to_next[:, None]
    return chosen


def joint_exponential_quantiles(
    x: ArrayLike,
    ps: Sequence[float],
    low: float,
    high: float,
    epsilon: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """The quantiles `ps` (strictly increasing, in (0, 1)) of `x` at once by JointExp, ε-DP
    in total; sorted.

    With q_0 = 0 and q_{m+1} = 1, the sorted outputs o_1 ≤ … ≤ o_m (o_0 = low,
    o_{m+1} = high) have utility u = −Σ_j |n_j − (q_j − q_{j−1})·n|, n_j the values in
    [o_{j−1}, o_j). One record added moves one n_j by 1 and every target by its gap, so u
    moves by at most Δ = 2·(1 − min_j (q_j − q_{j−1})), the authors' add/remove
    sensitivity (not their swap one, Δ = 2, which needs n public); the density is
    ∝ exp(ε·u/(2Δ)) on the sorted outputs, their exponent. The forward pass costs
    O(m·n), the draw O(m²·n); with one level this is `exponential_quantile`'s law.
    """
    joint = _joint_tables(x, ps, low, high, epsilon)
    chosen = _joint_sample_intervals(joint, rng)
    return np.sort(rng.uniform(joint.cut.lefts[chosen], joint.cut.rights[chosen]))


class _SecureDraws:
    """Gumbel and uniform draws from a deployed hospital's CSPRNG (`NoiseSource`), which
    draws normals only: a standard normal Z gives U = Φ(Z) uniform on (0, 1), and the
    Gumbel −log(−log Φ(Z)) is taken through log Φ so that its upper tail stays exact."""

    def __init__(self, source: NoiseSource) -> None:
        self.source = source

    def _normals(self, count: int) -> np.ndarray:
        return self.source.normal((count,), 1.0, torch.float64).numpy()

    def gumbel(self, size: tuple[int, ...]) -> np.ndarray:
        z = self._normals(math.prod(size)).reshape(size)
        return np.asarray(-np.log(-log_ndtr(z)))

    def uniform(self, low: ArrayLike, high: ArrayLike) -> np.ndarray | float:
        low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        u = ndtr(self._normals(max(low.size, 1))).reshape(low.shape)
        drawn = low + (high - low) * u
        return float(drawn) if drawn.ndim == 0 else drawn


def draws(rng: np.random.Generator | NoiseSource) -> np.random.Generator:
    """A generator's own draws (research noise), or the CSPRNG's (`_SecureDraws`)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return cast(np.random.Generator, _SecureDraws(rng))


@dataclass(frozen=True)
class ExponentialQuantiles:
    """Each hospital's own quantiles of a column by JointExp on its own records, at its
    own pure ε (a `LocalQuery`): in a federation the exact pooled ranks the mechanism
    samples from exist at no party (the server sees noisy sums only), so the exponential
    mechanism answers per hospital; the pooled quantiles are the noisy-histogram search
    (`Quantiles`). Under patient-level units (a patient holds at most `units` records,
    moving every rank by at most `units`) it runs at ε/units, so that one patient costs ε.
    The values are clipped to the public `domain`. A figure carries no noise std and no
    interval: the mechanism's rank error is bounded by a statement on the records (the
    widths between them), which is not released (`rank_error_bound`)."""

    column: str
    domain: tuple[float, float]
    probabilities: tuple[float, ...]
    epsilon: float

    def __post_init__(self) -> None:
        _intervals([], self.probabilities, *self.domain, self.epsilon)  # one-line errors

    @property
    def title(self) -> str:
        return f"exponential quantiles of {self.column}"

    @property
    def sensitivity(self) -> float:
        return 1.0  # a rank's; it scales no Gaussian noise

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray:
        """What the mechanism reads: the column's values (never released)."""
        return records.column(self.column)

    def length(self, hospitals: int) -> int:
        return hospitals * len(self.probabilities)

    def sample(
        self,
        own: np.ndarray,
        hospital: int,
        hospitals: int,
        units: int,
        rng: np.random.Generator | NoiseSource,
    ) -> np.ndarray:
        block = np.zeros((hospitals, len(self.probabilities)))
        block[hospital] = joint_exponential_quantiles(
            own, self.probabilities, *self.domain, self.epsilon / units, draws(rng)
        )
        return block.ravel()

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        rows = pooled.reshape(len(names), len(self.probabilities))
        return [
            Figure(self.title, f"hospital {name}: quantile {p:g}", float(v), math.nan, raw=False)
            for name, row in zip(names, rows, strict=True)
            for p, v in zip(self.probabilities, row, strict=True)
        ]
