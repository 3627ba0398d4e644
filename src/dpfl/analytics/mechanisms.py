"""The statistics' mechanisms: each hospital's sum vector and its sensitivity, the
Gaussian release charged to its ledger, the secure sum, and the figures post-processed
from the pooled noisy vector.

Neighbouring datasets differ by one unit added or removed: a record, or under
patient-level units a patient, of whom at most `max_records` records are kept
(`bounded`), so that a patient moves any vector by at most `max_records` times what one
record moves it (the triangle inequality on the L2 norm).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch

from dpfl.analytics.consistency import consistent, projected
from dpfl.data.dataset import first_records
from dpfl.privacy import events
from dpfl.privacy.accounts import STATISTIC_LABEL
from dpfl.privacy.errors import BudgetExceededError

if TYPE_CHECKING:
    from dpfl.federation.messages import SecureSum
    from dpfl.local.noise import NoiseSource
    from dpfl.privacy import Ledger

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: the bands are ±Z95 standard deviations."""


@dataclass(frozen=True)
class Records:
    """One hospital's records as the statistics read them: numeric columns in their own
    units, integer class labels (or None), survival time and event (or None), and each
    record's patient (None: each record is its own unit)."""

    columns: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    time: np.ndarray | None = None
    event: np.ndarray | None = None
    units: np.ndarray | None = None

    def __len__(self) -> int:
        for array in (*self.columns.values(), self.labels, self.time):
            if array is not None:
                return len(array)
        return 0

    def column(self, name: str) -> np.ndarray:
        """A numeric column, as floats."""
        values = self.values(name)
        if values.dtype.kind not in "biuf":
            raise ValueError(f"column {name!r} holds text: count its categories instead")
        return np.asarray(values, dtype=np.float64)

    def values(self, name: str) -> np.ndarray:
        """A column as stored: numbers, or a text column's category names (a category
        the study does not list is "other", a missing value "")."""
        if name not in self.columns:
            raise ValueError(f"no column {name!r}: the records have {sorted(self.columns)}")
        return np.asarray(self.columns[name])

    def take(self, keep: np.ndarray) -> Records:
        """The records at the indices `keep`."""

        def cut(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[keep]

        return Records(
            {n: c[keep] for n, c in self.columns.items()},
            cut(self.labels),
            cut(self.time),
            cut(self.event),
            cut(self.units),
        )


def bounded(records: Records, max_records: int | None) -> Records:
    """Each patient's first `max_records` records (all records where units are None), by
    `dpfl.data.dataset.first_records`."""
    if records.units is None:
        return records
    if max_records is None:
        raise ValueError("patient-level statistics need [data] max_records (the records kept)")
    return records.take(first_records(records.units, max_records))


COHORT = "cohort"
"""An interval that covers the exact figure of the records released (what a non-private
run on the same records prints) 95% of the time over the DP noise."""
POPULATION = "population"
"""An interval that covers the figure of the population the records are a sample of 95%
of the time over the sampling and the DP noise together (asymptotically)."""


@dataclass(frozen=True)
class Figure:
    """One released figure, the std of its DP noise and its 95% interval (`band`): its
    own `interval`, or value ± Z95 std where the noise is additive (a raw noisy value;
    a percentage, by the delta method), or none (a test's figure, a figure of no
    Gaussian noise). `covers` says what the interval covers (`COHORT` or `POPULATION`);
    `raw` is True for a noisy value as released (unbiased), False where it was
    post-processed (clamped, made consistent with its total, a ratio) and may be biased."""

    statistic: str
    name: str
    value: float
    std: float
    interval: tuple[float, float] | None = None
    at: float | None = None
    """Where a curve's point lies (a Kaplan–Meier figure: its bin's end time)."""
    covers: str = COHORT
    raw: bool = True
    cell: tuple[str, str] | None = None
    """Where a cross-tabulated figure lies: its (site, group) column of Table 1."""

    @property
    def band(self) -> tuple[float, float] | None:
        """Its 95% interval: its own, or value ± Z95·std for a raw noisy value; None for
        a figure without one (a test's p-value, a figure of no Gaussian noise)."""
        if self.interval is not None:
            return self.interval
        if not math.isfinite(self.std):
            return None
        return self.value - Z95 * self.std, self.value + Z95 * self.std


class Query(Protocol):
    """A statistic: its title, each hospital's sum vector, the vector's L2 sensitivity
    to one record, and the figures of the pooled noisy vector."""

    @property
    def title(self) -> str: ...

    @property
    def sensitivity(self) -> float: ...

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray: ...

    def length(self, hospitals: int) -> int:
        """The vector's length (a public fact: what a secure sum is set up for)."""
        ...

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]: ...


@runtime_checkable
class LocalQuery(Query, Protocol):
    """A statistic each hospital releases on its own records by its own ε-DP mechanism
    (the exponential mechanism's quantiles), not a Gaussian sum: `vector` is what the
    mechanism reads (never released), `sample` draws the hospital's released block of
    the pooled vector (its own place of K, zeros elsewhere) after `event` is charged."""

    @property
    def epsilon(self) -> float: ...

    def sample(
        self,
        own: np.ndarray,
        hospital: int,
        hospitals: int,
        units: int,
        rng: np.random.Generator | NoiseSource,
    ) -> np.ndarray: ...


def event_of(
    query: Query, noise_multiplier: float, neighbouring: events.Neighbouring
) -> events.PrivacyEvent:
    """What releasing `query` costs: a local mechanism's pure ε, else the Gaussian's."""
    if isinstance(query, LocalQuery):
        return events.approximate_dp(query.epsilon, 0.0, neighbouring=neighbouring)
    return events.gaussian(noise_multiplier, neighbouring=neighbouring)


def plan_event(
    queries: Sequence[Query], noise_multiplier: float, neighbouring: events.Neighbouring
) -> events.PrivacyEvent:
    """Every query's release, composed: the Gaussian ones at σ, the local ones at their
    own ε (basic composition on top)."""
    local = [event_of(q, noise_multiplier, neighbouring) for q in queries if is_local(q)]
    gaussians = len(queries) - len(local)
    if not local:
        return events.gaussian(noise_multiplier, count=gaussians, neighbouring=neighbouring)
    if not gaussians:
        return events.compose(local)
    gaussian = events.gaussian(noise_multiplier, count=gaussians, neighbouring=neighbouring)
    return events.compose([gaussian, *local])


def is_local(query: Query) -> bool:
    """Whether a hospital releases `query` by its own mechanism (`LocalQuery`)."""
    return isinstance(query, LocalQuery)


def release(
    vector: np.ndarray,
    sensitivity: float,
    noise_multiplier: float,
    *,
    ledger: Ledger,
    accounts: Sequence[str],
    label: str,
    rng: np.random.Generator | NoiseSource,
    neighbouring: events.Neighbouring = events.Neighbouring.ADD_REMOVE,
) -> np.ndarray:
    """A hospital's half: charge the Gaussian event to its `accounts` (one durable
    transaction; refused past a budget, and then nothing is released), then add noise of
    std noise_multiplier × sensitivity to every coordinate, drawn from `rng` (a
    deployment's hospital: the CSPRNG, `SecureNoise`)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier!r}")
    event = events.gaussian(noise_multiplier, neighbouring=neighbouring)
    ledger.record_many([(account, event) for account in accounts], label=label)
    std = noise_multiplier * sensitivity
    if isinstance(rng, np.random.Generator):
        drawn = rng.normal(0.0, std, vector.shape)
    else:
        drawn = rng.normal(tuple(vector.shape), std, torch.float64).numpy()
    noisy: np.ndarray = vector + drawn
    return noisy


def pooled(noisy: Mapping[str, np.ndarray], summing: SecureSum) -> np.ndarray:
    """The server's half: the sum of the hospitals' noisy vectors through the study's
    secure sum (masking or HE reveal the sum only)."""
    vectors = {name: torch.from_numpy(np.asarray(v, dtype=np.float64)) for name, v in noisy.items()}
    total = summing(vectors, at_least=len(vectors))
    return np.asarray(total.total.numpy(), dtype=np.float64)


def matches(values: np.ndarray, value: str | float) -> np.ndarray:
    """Where a column holds `value`: a text column's category compared as written, a
    number's as a number."""
    if values.dtype.kind in "biuf":
        if isinstance(value, str):
            raise ValueError(f"the column holds numbers, not {value!r}")
        return np.asarray(values == float(value))
    return np.asarray(values == str(value))


def shown(value: str | float) -> str:
    """A declared value as a figure's name shows it."""
    return f"{value:g}" if isinstance(value, int | float) else str(value)


@dataclass(frozen=True)
class Count:
    """Record counts: each hospital's (one-hot at its index), the pooled count, one per
    declared class label, and one per declared category of each declared column (a text
    column's categories, or a number's values; any other value, or none, counted as
    "other"). One record moves its hospital's, the pooled, its label's and one category
    per column's count by 1. `consistent`: the figures are post-processed into
    non-negative integers, the hospitals', the labels' and each column's categories
    summing to the pooled count (`dpfl.analytics.consistency`), else the raw noisy
    counts."""

    classes: tuple[int, ...] = ()
    categories: Mapping[str, tuple[str | float, ...]] = field(default_factory=dict)
    title: str = "counts"
    consistent: bool = False

    @property
    def sensitivity(self) -> float:
        return math.sqrt(2 + bool(self.classes) + len(self.categories))

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray:
        parts = [np.eye(hospitals)[hospital] * len(records), [len(records)]]
        if self.classes:
            if records.labels is None:
                raise ValueError("counts per label: the records have no class labels")
            parts.append([np.sum(records.labels == c) for c in self.classes])
        for name, values in self.categories.items():
            x = records.values(name)
            listed = [np.sum(matches(x, v)) for v in values]
            parts.append([*listed, len(x) - sum(listed)])
        return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])

    def length(self, hospitals: int) -> int:
        return hospitals + 1 + len(self.classes) + sum(len(v) + 1 for v in self.categories.values())

    def _groups(self, hospitals: int) -> list[range]:
        """The index ranges of the parts that sum to the pooled count (at `hospitals`)."""
        sizes = [len(self.classes)] if self.classes else []
        sizes += [len(v) + 1 for v in self.categories.values()]
        starts = np.cumsum([hospitals + 1, *sizes])
        return [range(hospitals)] + [
            range(a - n, a) for a, n in zip(starts[1:], sizes, strict=True)
        ]

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        labels = [f"hospital {n}" for n in names] + ["pooled"]
        labels += [f"label {c}" for c in self.classes]
        for name, values in self.categories.items():
            labels += [f"{name} = {shown(v)}" for v in values] + [f"{name} = other"]
        stds = np.full(len(pooled), std)
        if self.consistent:
            groups = self._groups(len(names))
            _, diagonal = projected(pooled, len(names), groups)
            pooled, stds = consistent(pooled, len(names), groups), std * np.sqrt(diagonal)
        return [
            Figure(self.title, label, float(v), float(s), raw=not self.consistent)
            for label, v, s in zip(labels, pooled, stds, strict=True)
        ]


def check_edges(edges: Sequence[float], what: str) -> np.ndarray:
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or len(e) < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
        raise ValueError(f"{what}: bins must be at least two increasing finite edges")
    return e


def _histogram(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per bin, a value outside the edges counted in the end bin it is nearest."""
    index = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    return np.bincount(index, minlength=len(edges) - 1).astype(np.float64)


@dataclass(frozen=True)
class Histogram:
    """Counts of a column over declared bin edges; one record moves one bin by 1."""

    column: str
    edges: tuple[float, ...]

    def __post_init__(self) -> None:
        check_edges(self.edges, f"histogram of {self.column}")

    @property
    def title(self) -> str:
        return f"histogram of {self.column}"

    @property
    def sensitivity(self) -> float:
        return 1.0

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray:
        return _histogram(records.column(self.column), np.asarray(self.edges))

    def length(self, hospitals: int) -> int:
        return len(self.edges) - 1

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        e = self.edges
        return [
            Figure(self.title, f"[{e[i]:g}, {e[i + 1]:g})", float(v), std)
            for i, v in enumerate(pooled)
        ]


@dataclass(frozen=True)
class Mean:
    """Mean and standard deviation of a column clipped to its declared range [a, b].

    The vector is (n, Σz, Σ(z² − 1/2)) with z the clipped value mapped onto [−1, 1]: one
    record moves it by (1, z, z² − 1/2), of L2 norm at most √(1 + 1 + 1/4) = 1.5. Mean and
    variance are post-processed from the noisy sums (clamped to their possible ranges), so
    each has a `COHORT` interval by the delta method: the mean's on its noisy ratio, the
    standard deviation's on the variance's, mapped through the square root (defined where
    the root's derivative is not, at a variance near 0); the standard deviation's std is
    its interval's half width over Z95, as a quantile's."""

    column: str
    range: tuple[float, float]

    def __post_init__(self) -> None:
        low, high = self.range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"mean of {self.column}: bad public range {self.range!r}")

    @property
    def title(self) -> str:
        return f"mean of {self.column}"

    @property
    def sensitivity(self) -> float:
        return 1.5

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray:
        low, high = self.range
        x = np.clip(records.column(self.column), low, high)
        z = (x - (low + high) / 2) / ((high - low) / 2)
        return np.array([len(z), z.sum(), (z**2 - 0.5).sum()])

    def length(self, hospitals: int) -> int:
        return 3

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        low, high = self.range
        half, centre = (high - low) / 2, (low + high) / 2
        n = max(float(pooled[0]), 1.0)
        mean_z = float(np.clip(pooled[1] / n, -1, 1))
        square_z = float(np.clip(pooled[2] / n + 0.5, 0, 1))
        variance = square_z - mean_z**2
        mean, mean_std = centre + half * mean_z, half * std * math.sqrt(1 + mean_z**2) / n
        # ∂variance/∂(n, Σz, Σ(z² − 1/2)) = (2 mean_z² − square_z + 1/2, −2 mean_z, 1) / n
        spread = Z95 * std * math.sqrt(1 + 4 * mean_z**2 + (square_z - 0.5 - 2 * mean_z**2) ** 2)
        low_sd, high_sd = (
            half * math.sqrt(min(max(variance + z * spread / n, 0.0), 1.0)) for z in (-1, 1)
        )
        return [
            Figure(self.title, "count", float(pooled[0]), std),
            Figure(
                self.title,
                "mean",
                mean,
                mean_std,
                (max(mean - Z95 * mean_std, low), min(mean + Z95 * mean_std, high)),
                raw=False,
            ),
            Figure(
                self.title,
                "standard deviation",
                half * math.sqrt(max(variance, 0.0)),
                (high_sd - low_sd) / (2 * Z95),
                (low_sd, high_sd),
                raw=False,
            ),
        ]


def _bridge_stds(p: float, bins: int) -> np.ndarray:
    """The std of C_j − p·N at each edge j, per unit of a bin's noise std."""
    j = np.arange(bins + 1)
    stds: np.ndarray = np.sqrt(j * (1 - p) ** 2 + (bins - j) * p**2)
    return stds


@functools.cache
def _simultaneous_z(p: float, bins: int, draws: int = 4000) -> float:
    """The 97.5% quantile of max_j (C_j − p·N)'s noise / its std over the edges: a
    property of Gaussian noise on `bins` bins alone (public), drawn once from a fixed
    seed."""
    steps = np.random.default_rng(0).normal(0.0, 1.0, (draws, bins))
    walks = np.c_[np.zeros(draws), np.cumsum(steps, axis=1)]
    deviation = (walks - p * walks[:, -1:]) / _bridge_stds(p, bins)
    return float(np.quantile(deviation.max(axis=1), 0.975))


@dataclass(frozen=True)
class Quantiles(Histogram):
    """Quantiles of a column over its declared domain by a noisy-histogram search: the
    Gaussian histogram over the declared fine bins (`Histogram`), its counts clamped at 0,
    and each quantile read where the cumulative count crosses p of the total (linear
    within the bin): post-processing of one DP histogram (Dwork, McSherry, Nissim & Smith
    2006 for the histogram; the CDF-inversion estimator is the "histogram" baseline of
    Gillenwater, Joseph & Kulesza, ICML 2021).

    Each quantile's interval covers the records' exact quantile (the smallest value
    with at least p of the records at or below it, values clipped to the domain) at
    least 95% of the time (`COHORT`): it is made of whole bins, so it also holds the
    error of interpolating inside a bin. The quantile is at or above edge e_j exactly
    when T_j = C_j − p·N < 0 (C_j the records below e_j, N all of them); T's noise is a
    bridge of the bins' noise, of std s_j, and the bounds are the edges where T̂_j ± z·s_j
    settles the sign, z the 97.5% quantile of the largest standardised deviation over
    every edge (`_simultaneous_z`: a band simultaneous in j, so that each side errs at
    most 2.5% of the time). It is conservative where the noise
    is small next to a bin's count: then the interval is the bin holding the quantile."""

    probabilities: tuple[float, ...] = (0.01, 0.25, 0.5, 0.75, 0.99)

    def __post_init__(self) -> None:
        check_edges(self.edges, f"quantiles of {self.column}")
        if not all(0 < p < 1 for p in self.probabilities):
            raise ValueError(f"quantiles of {self.column}: probabilities must be in (0, 1)")

    @property
    def title(self) -> str:
        return f"quantiles of {self.column}"

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        edges = np.asarray(self.edges)
        cdf = np.r_[0.0, np.cumsum(np.maximum(pooled, 0.0))]
        total = max(cdf[-1], 1.0)
        noisy = np.r_[0.0, np.cumsum(pooled)]  # unbiased: T̂_j = noisy_j − p·noisy_B
        figures = []
        for p in self.probabilities:
            t = noisy - p * noisy[-1]
            s = _bridge_stds(p, len(pooled))
            z = _simultaneous_z(p, len(pooled)) if std > 0 else 0.0
            below = np.flatnonzero(t[:-1] + z * std * s[:-1] < 0)  # surely at or above e_j
            above = np.flatnonzero(t[1:] - z * std * s[1:] >= 0) + 1  # surely below e_j
            low, high = sorted(
                (
                    edges[below[-1]] if len(below) else edges[0],
                    edges[above[0]] if len(above) else edges[-1],
                )
            )
            value = float(np.interp(p * total, cdf, edges))
            figures.append(
                Figure(
                    self.title,
                    f"quantile {p:g}",
                    value,
                    (high - low) / (2 * Z95),
                    (float(low), float(high)),
                    raw=False,
                )
            )
        return figures


@dataclass(frozen=True)
class Released:
    """A stats run's figures, and per statistic the noise multiplier and the std of one
    pooled coordinate's noise."""

    figures: list[Figure]
    noise: dict[str, float]


def neighbouring_of(records: Records) -> events.Neighbouring:
    """Patient-level neighbours where the records name their patients, else records'."""
    if records.units is None:
        return events.Neighbouring.ADD_REMOVE
    return events.Neighbouring.ADD_REMOVE_PATIENT


def plan_refusal(
    ledger: Ledger,
    accounts: Sequence[str],
    queries: Sequence[Query],
    noise_multiplier: float,
    neighbouring: events.Neighbouring,
) -> str | None:
    """Why releasing every query would pass a budget of one of `accounts` (None: it
    fits): the whole plan checked before anything is released."""
    plan = plan_event(queries, noise_multiplier, neighbouring)
    return ledger.refusal([(a, plan) for a in accounts])


def vectors(
    records: Records,
    queries: Sequence[Query],
    hospital: int,
    hospitals: int,
    max_records: int | None,
) -> list[np.ndarray]:
    """A hospital's vector of each query over its bounded records (`bounded`): computed
    before anything is charged, so that a bad column is refused first."""
    kept = bounded(records, max_records)
    return [query.vector(kept, hospital, hospitals) for query in queries]


def group(records: Records, max_records: int | None) -> int:
    """The records a unit may hold: `max_records` for patients, else 1."""
    return max_records if records.units is not None and max_records is not None else 1


def released(
    own: Sequence[np.ndarray],
    queries: Sequence[Query],
    noise_multiplier: float,
    units: int,
    *,
    ledger: Ledger,
    accounts: Sequence[str],
    rng: np.random.Generator | NoiseSource,
    neighbouring: events.Neighbouring,
    hospital: int = 0,
    hospitals: int = 1,
) -> list[np.ndarray]:
    """A hospital's half of every query, its event charged to `accounts` first: each
    vector `release`d at sensitivity × `units` (the records a unit may hold), or a
    `LocalQuery`'s block sampled by its own mechanism."""
    out = []
    for query, vector in zip(queries, own, strict=True):
        label = f"{STATISTIC_LABEL}{query.title}"
        if isinstance(query, LocalQuery):
            event = event_of(query, noise_multiplier, neighbouring)
            ledger.record_many([(account, event) for account in accounts], label=label)
            out.append(query.sample(vector, hospital, hospitals, units, rng))
            continue
        out.append(
            release(
                vector,
                query.sensitivity * units,
                noise_multiplier,
                ledger=ledger,
                accounts=accounts,
                label=label,
                rng=rng,
                neighbouring=neighbouring,
            )
        )
    return out


def figures_of(
    queries: Sequence[Query],
    summed: Sequence[np.ndarray],
    noise_multiplier: float,
    units: int,
    names: Sequence[str],
    rng: np.random.Generator,
) -> Released:
    """The server's half: each query's figures post-processed from its pooled noisy
    vector, whose noise has std σ·Δ·√K over the K hospitals `names`."""
    figures: list[Figure] = []
    noise: dict[str, float] = {}
    for query, total in zip(queries, summed, strict=True):
        std = 0.0  # a local mechanism's block holds no Gaussian noise
        if not isinstance(query, LocalQuery):
            std = noise_multiplier * query.sensitivity * units * math.sqrt(len(names))
            noise[query.title] = std
        figures += query.figures(total, std, names, rng)
    return Released(figures, noise)


def describe(
    cohort: Mapping[str, Records],
    queries: Sequence[Query],
    noise_multiplier: float,
    *,
    ledger: Ledger,
    accounts: Mapping[str, Sequence[str]],
    summing: SecureSum,
    rng: np.random.Generator,
    max_records: int | None = None,
    noise: Mapping[str, np.random.Generator | NoiseSource] | None = None,
) -> Released:
    """Release every query: each hospital bounds its records (`bounded`), computes its
    vector, charges its ledger accounts (`accounts[name]`) and adds its noise (from
    `noise[name]`, or `rng`); the server sums the noisy vectors and post-processes the
    figures (with `rng`). The pooled noise of a coordinate has std σ·Δ·√K over K
    hospitals (Δ per patient: max_records × per record). The whole plan (every query,
    every account) is checked against the ledger first: a run past any hospital's
    budget is refused before anything is released. A deployment runs the same halves
    on each machine (`dpfl.engines.flower.analytics`)."""
    names = list(cohort)
    first = next(iter(cohort.values()), Records({}))
    neighbouring, units = neighbouring_of(first), group(first, max_records)
    refused = plan_refusal(
        ledger,
        [a for name in names for a in accounts[name]],
        queries,
        noise_multiplier,
        neighbouring,
    )
    if refused is not None:
        raise BudgetExceededError(f"stats refused before any release: {refused}")
    own = {  # every vector first: a bad column is refused before anything is charged
        name: vectors(records, queries, k, len(names), max_records)
        for k, (name, records) in enumerate(cohort.items())
    }
    noisy = {
        name: released(
            own[name],
            queries,
            noise_multiplier,
            units,
            ledger=ledger,
            accounts=accounts[name],
            rng=rng if noise is None else noise[name],
            neighbouring=neighbouring,
            hospital=k,
            hospitals=len(names),
        )
        for k, name in enumerate(names)
    }
    summed = [pooled({n: noisy[n][q] for n in names}, summing) for q in range(len(queries))]
    return figures_of(queries, summed, noise_multiplier, units, names, rng)
