"""How often a statistic's 95% intervals hold the truth they claim to cover, measured by
running its release many times: each run draws the hospitals' vectors (the same records
for a `COHORT` interval, a resample of them for a `POPULATION` one), adds each its own
Gaussian noise of std σ·Δ, and post-processes the sum as the server does (`figures_of`).
tests/analytics/test_coverage.py asserts it; benchmarks/bench_stats.py prints it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dpfl.analytics.mechanisms import Query, figures_of


def coverage(
    query: Query,
    hospitals: Callable[[np.random.Generator], Sequence[np.ndarray]],
    truth: Sequence[float],
    noise_multiplier: float,
    seeds: int,
) -> np.ndarray:
    """Per figure of `query`, the fraction of `seeds` runs (seed s: its vectors
    `hospitals(rng)`, its noise, its post-processing all from `default_rng(s)`) whose
    interval (`Figure.band`) holds `truth`."""
    hits, std = np.zeros(len(truth)), noise_multiplier * query.sensitivity
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        vectors = hospitals(rng)
        summed = sum(v + rng.normal(0.0, std, v.shape) for v in vectors)
        names = [str(k) for k in range(len(vectors))]
        released = figures_of([query], [np.asarray(summed)], noise_multiplier, 1, names, rng)
        bands = np.array([f.band for f in released.figures])
        hits += (bands[:, 0] <= truth) & (truth <= bands[:, 1])
    covered: np.ndarray = hits / seeds
    return covered
