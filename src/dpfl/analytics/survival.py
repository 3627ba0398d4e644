"""Survival statistics on public time bins: the Kaplan–Meier curve from DP counts of
events and censorings per bin.

A bin is (e_{j−1}, e_j]: an event at a bin's end time is inside it, as Kaplan–Meier's
S(t) = P(T > t) counts a death at t. A record followed past the last edge is censored at
the last edge (it was alive there), whatever happened to it later; a time at or before
the first edge counts in the first bin. The at-risk count at a bin's start is the total
less the earlier bins' events and censorings: the curve equals Kaplan–Meier's on the
times rounded up to their bin's end (deaths before censorings at a tie, as Kaplan–Meier
orders them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpfl.analytics.mechanisms import POPULATION, Z95, Figure, Records, check_edges


def survival_counts(time: np.ndarray, event: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(events per bin, censorings per bin), end to end: one record moves one
    coordinate by 1. A time past the last edge is a censoring in the last bin."""
    bins = len(edges) - 1
    index = np.maximum(np.searchsorted(edges, time, side="left") - 1, 0)
    died = event.astype(bool) & (index < bins)
    where = np.minimum(index, bins - 1)
    return np.concatenate(
        [
            np.bincount(where[died], minlength=bins),
            np.bincount(where[~died], minlength=bins),
        ]
    ).astype(np.float64)


def risk_sets(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From (events, censorings) per bin along the last axis, each clamped at 0: the
    events per bin and the count at risk at each bin's start (the total less the earlier
    bins' events and censorings; never below the bin's events)."""
    counts = np.maximum(counts, 0.0)
    bins = counts.shape[-1] // 2
    d, c = counts[..., :bins], counts[..., bins:]
    leaving = np.cumsum(d + c, axis=-1)
    before = np.concatenate([np.zeros_like(leaving[..., :1]), leaving[..., :-1]], axis=-1)
    return d, leaving[..., -1:] - before


def curve(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """From (events, censorings) per bin (rows of `counts` may stack several draws, each
    clamped at 0): S at each bin's end, Greenwood's variance of it, and the events and
    at-risk counts per bin the product used."""
    d, at_risk = risk_sets(np.atleast_2d(counts))
    at_risk = np.maximum(at_risk, 1.0)
    d = np.minimum(d, at_risk)
    s = np.cumprod(1 - d / at_risk, axis=1)
    greenwood = s**2 * np.cumsum(d / (at_risk * np.maximum(at_risk - d, 1.0)), axis=1)
    return s, greenwood, d, at_risk


@dataclass(frozen=True)
class KaplanMeier:
    """A Kaplan–Meier curve on public time bins (`survival_counts`): S(t_b) =
    Π_{j≤b}(1 − d_j/n_j) from the pooled noisy counts. Its 95% band covers the
    population's curve (`POPULATION`): ±Z95 × the square root of Greenwood's variance
    plus the DP noise's (the variance of S over `draws` redraws of the declared noise on
    the released counts: post-processing)."""

    edges: tuple[float, ...]
    draws: int = 400

    def __post_init__(self) -> None:
        check_edges(self.edges, "Kaplan–Meier")

    @property
    def title(self) -> str:
        return "Kaplan–Meier"

    @property
    def sensitivity(self) -> float:
        return 1.0

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray:
        if records.time is None or records.event is None:
            raise ValueError("Kaplan–Meier: the records have no time and event")
        return survival_counts(records.time, records.event, np.asarray(self.edges))

    def length(self, hospitals: int) -> int:
        return 2 * (len(self.edges) - 1)

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        redrawn = pooled + rng.normal(0.0, std, (self.draws, len(pooled)))
        return curve_figures(self.title, self.edges, pooled, redrawn)


def curve_figures(
    title: str, edges: Sequence[float], counts: np.ndarray, redrawn: np.ndarray, of: str = ""
) -> list[Figure]:
    """S at each bin's end from noisy (events, censorings) per bin, each with its 95%
    band (`POPULATION`): ±Z95 × √(Greenwood's variance + the variance of S over the
    `redrawn` counts, the released ones with the declared noise drawn again). `of` names
    the group after each figure's name."""
    (s,), (greenwood,), _, _ = curve(counts)
    spread = np.sqrt(greenwood + curve(redrawn)[0].var(axis=0))
    return [
        Figure(
            title,
            f"S({edges[b + 1]:g}){of}",
            float(s[b]),
            float(spread[b]),
            (float(max(s[b] - Z95 * spread[b], 0)), float(min(s[b] + Z95 * spread[b], 1))),
            edges[b + 1],
            covers=POPULATION,
            raw=False,
        )
        for b in range(len(s))
    ]
