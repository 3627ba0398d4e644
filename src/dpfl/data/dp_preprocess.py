"""Differentially private statistics of a silo's records, paid for in its ledger.

Used where preprocessing needs something of the private data (feature means and
standard deviations for scaling, a choice of features). Each function clips every
record to declared public bounds, so that one record's influence is bounded whatever
the data, releases noisy sums through one Gaussian mechanism, and records that event in
the silo's ledger *before* anything noisy is returned. Neighbouring datasets differ by
adding or removing one record, so the private record count is never used: it is
released, noisily, by the same mechanism.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpfl.data.dataset import Dataset
from dpfl.data.preprocess import require_finite
from dpfl.privacy import events

if TYPE_CHECKING:
    from dpfl.privacy import Ledger


@dataclass(frozen=True)
class DpMoments:
    """Noisy per-feature mean and std (in the features' own units) and noisy count."""

    feature_names: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    noisy_count: float


def _normalised(dataset: Dataset, ranges: Mapping[str, tuple[float, float]]) -> np.ndarray:
    """The named columns clipped to their bounds and mapped affinely onto [-1, 1]."""
    require_finite(dataset)
    if dataset.features.ndim != 2 or not isinstance(dataset.features, np.ndarray):
        raise ValueError(f"{dataset.name}: DP statistics need a dense 2-D feature table")
    if not ranges:
        raise ValueError("declare at least one feature's public range")
    columns = []
    for name, (low, high) in ranges.items():
        if name not in dataset.feature_names:
            raise ValueError(f"{dataset.name} has no feature {name!r}")
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise ValueError(f"bad public range {(low, high)!r} for {name!r}")
        x = dataset.features[:, dataset.feature_names.index(name)].astype(np.float64)
        columns.append((np.clip(x, low, high) - (low + high) / 2) / ((high - low) / 2))
    return np.stack(columns, axis=1)


def _gaussian_release(
    sums: np.ndarray,
    sensitivity: float,
    noise_multiplier: float,
    *,
    ledger: Ledger,
    silo: str,
    label: str,
    rng: np.random.Generator,
) -> np.ndarray:
    """Record the Gaussian event in `silo`'s ledger (raising if unaffordable), then add
    noise of std noise_multiplier x sensitivity to every coordinate of `sums`."""
    if not np.isfinite(noise_multiplier) or noise_multiplier <= 0:
        raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier!r}")
    ledger.record(silo, events.gaussian(noise_multiplier), label=label)
    noisy: np.ndarray = sums + rng.normal(0.0, noise_multiplier * sensitivity, sums.shape)
    return noisy


def dp_mean_std(
    dataset: Dataset,
    ranges: Mapping[str, tuple[float, float]],
    *,
    noise_multiplier: float,
    ledger: Ledger,
    silo: str,
    rng: np.random.Generator,
) -> DpMoments:
    """DP mean and std of the named features, from one Gaussian release.

    Each value is clipped to its public range [a, b] and mapped to z in [-1, 1]. The
    released vector is (n, Σz, Σ(z² - 1/2)) over the d features: adding or removing one
    record moves it by (1, z, z² - 1/2) with |z_j| <= 1 and |z_j² - 1/2| <= 1/2, so its L2
    sensitivity is sqrt(1 + d + d/4). Mean and variance are post-processed from the
    noisy sums and the noisy count (clamped to their possible ranges), which costs
    nothing more.
    """
    z = _normalised(dataset, ranges)
    d = z.shape[1]
    sums = np.concatenate([[len(z)], z.sum(0), (z**2 - 0.5).sum(0)])
    label = f"dp mean/std of {d} features of {dataset.name}"
    noisy = _gaussian_release(
        sums,
        np.sqrt(1 + 1.25 * d),
        noise_multiplier,
        ledger=ledger,
        silo=silo,
        label=label,
        rng=rng,
    )
    count = max(float(noisy[0]), 1.0)
    mean_z = np.clip(noisy[1 : d + 1] / count, -1, 1)
    square_z = np.clip(noisy[d + 1 :] / count + 0.5, 0, 1)
    low = np.array([lo for lo, _ in ranges.values()])
    high = np.array([hi for _, hi in ranges.values()])
    half = (high - low) / 2
    return DpMoments(
        feature_names=tuple(ranges),
        mean=(low + high) / 2 + half * mean_z,
        std=half * np.sqrt(np.maximum(square_z - mean_z**2, 0)),
        noisy_count=float(noisy[0]),
    )


def dp_top_k_features(
    dataset: Dataset,
    ranges: Mapping[str, tuple[float, float]],
    k: int,
    *,
    noise_multiplier: float,
    ledger: Ledger,
    silo: str,
    rng: np.random.Generator,
) -> tuple[str, ...]:
    """The k features whose noisy class-difference score is largest: private selection.

    Score of feature j: Σ over records of z_j · (+1 if label 1 else -1), with z in
    [-1, 1] as in `dp_mean_std` (binary labels only). One record moves every score by
    at most 1, so the score vector's L2 sensitivity is sqrt(d); all d scores are
    released by one Gaussian mechanism and the top k by |score| are post-processing.
    Noise grows with sqrt(d): declare a pre-filtered candidate list when d is large.
    """
    if set(np.unique(dataset.labels).tolist()) - {0, 1}:
        raise ValueError("dp_top_k_features needs binary labels 0/1")
    if not 1 <= k <= len(ranges):
        raise ValueError(f"k must be in 1..{len(ranges)}, got {k}")
    z = _normalised(dataset, ranges)
    signs = 2.0 * dataset.labels - 1.0
    label = f"dp top-{k} of {z.shape[1]} features of {dataset.name}"
    noisy = _gaussian_release(
        signs @ z,
        np.sqrt(z.shape[1]),
        noise_multiplier,
        ledger=ledger,
        silo=silo,
        label=label,
        rng=rng,
    )
    names = list(ranges)
    top = np.argsort(-np.abs(noisy), kind="stable")[:k]
    return tuple(names[j] for j in sorted(top))
