"""Counts made consistent with their totals: post-processing of released noisy counts,
free under DP (it reads nothing but the released values).

Noisy counts are fractional, may be negative, and their parts do not sum to their total.
With every count's noise of the same std, the least-squares estimate under the
constraints "each group of parts sums to the total" is the orthogonal projection onto
them (ordinary least squares with equality constraints: unbiased, and of std σ√P_ii,
P the projector). Non-negative integers then follow per group: the projection onto the
simplex {x ≥ 0, Σx = T} (Duchi et al., ICML 2008), T the total rounded and at least 0,
and the largest-remainder rounding, which keeps the sum. These last two steps bias
counts near 0 upwards: such figures are marked `raw = False`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def projected(
    values: np.ndarray, total: int, groups: Sequence[Sequence[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """The projector P onto {x : Σ_{i∈g} x_i = x_total for every group g}, applied to
    `values`, and P's diagonal, as (estimate, diagonal)."""
    constraints = np.zeros((len(groups), len(values)))
    for row, group in enumerate(groups):
        constraints[row, list(group)] = 1.0
        constraints[row, total] = -1.0
    projector = (
        np.eye(len(values))
        - constraints.T @ np.linalg.pinv(constraints @ constraints.T) @ constraints
    )
    return projector @ values, np.diag(projector).copy()


def simplex(values: np.ndarray, total: float) -> np.ndarray:
    """The Euclidean projection of `values` onto {x ≥ 0, Σx = total} (total ≥ 0)."""
    if total <= 0:
        return np.zeros_like(values)
    ordered = np.sort(values)[::-1]
    cumulative = np.cumsum(ordered) - total
    ranks = np.arange(1, len(values) + 1)
    last = np.flatnonzero(ordered - cumulative / ranks > 0)[-1]
    projection: np.ndarray = np.maximum(values - cumulative[last] / (last + 1), 0.0)
    return projection


def integers(values: np.ndarray, total: int) -> np.ndarray:
    """Non-negative integers summing to `total`, nearest `values` (≥ 0, summing to it):
    each rounded down, then one more to the largest remainders."""
    down: np.ndarray = np.floor(values)
    short = int(total - down.sum())
    order = np.argsort(-(values - down), kind="stable")
    down[order[:short]] += 1
    return down


def consistent(values: np.ndarray, total: int, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Non-negative integers: the total, and each group's parts summing to it."""
    estimate, _ = projected(values, total, groups)
    whole = max(round(float(estimate[total])), 0)
    out = np.zeros(len(values))
    out[total] = whole
    for group in groups:
        index = list(group)
        out[index] = integers(simplex(estimate[index], whole), whole)
    return out
