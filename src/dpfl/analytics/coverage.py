"""How often a statistic's 95% intervals hold the truth they claim to cover, measured by
running its release many times: each run draws the hospitals' vectors (the same records
for a `COHORT` interval, a resample of them for a `POPULATION` one), adds each its own
Gaussian noise of std σ·Δ, and post-processes the sum as the server does (`figures_of`).
tests/analytics/test_coverage.py asserts it; benchmarks/bench_stats.py prints it."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from dpfl.analytics.mechanisms import Query, Records, figures_of


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


def flchain(hospitals: int = 3) -> dict[str, Records]:
    """The cohort coverage is measured on: scikit-survival's FLCHAIN (bundled with it, no
    download; 7,874 people, integer ages and days, with ties) in `hospitals` hospitals by
    a fixed hash of the row, with death as the label and sex (1: male) as a column."""
    from sksurv.datasets import load_flchain

    features, outcome = load_flchain()
    records = Records(
        {"age": features["age"].to_numpy(), "sex": (features["sex"] == "M").to_numpy() * 1.0},
        labels=outcome["death"].astype(int),
        time=outcome["futime"],
        event=outcome["death"],
    )
    site = np.array([zlib.crc32(str(i).encode()) % hospitals for i in range(len(records))])
    return {f"hospital-{k}": records.take(np.flatnonzero(site == k)) for k in range(hospitals)}
