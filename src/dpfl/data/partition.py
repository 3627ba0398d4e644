"""Federated partitions: which records each silo holds, and each silo's own splits.

Every function returns index arrays into the dataset, is deterministic given `seed`,
and covers each record exactly once (a partition, not a sample). Splitting reads only
labels and site ids to place records; it releases nothing, so it costs no budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Partition = list[np.ndarray]
"""One sorted int64 index array per silo."""


def _check_count(n_records: int, n_parts: int, what: str) -> None:
    if not isinstance(n_parts, int | np.integer) or n_parts < 1:
        raise ValueError(f"{what} must be a positive integer, got {n_parts!r}")
    if n_parts > n_records:
        raise ValueError(f"cannot make {n_parts} {what} from {n_records} records")


def _labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    return labels


def _stratified_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A permutation in which every class is spread evenly, so any contiguous cut of it
    has (up to one record per class) the overall class proportions."""
    key = np.empty(len(labels))
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        rng.shuffle(members)
        key[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.lexsort((rng.random(len(labels)), key))


def _cut(order: np.ndarray, fractions: Sequence[float] | np.ndarray) -> Partition:
    sizes = _sizes(len(order), np.asarray(fractions, dtype=float))
    return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]


def _sizes(n: int, fractions: np.ndarray) -> np.ndarray:
    """Integer sizes summing to n, by largest remainder."""
    raw = fractions / fractions.sum() * n
    sizes: np.ndarray = np.floor(raw).astype(np.int64)
    sizes[np.argsort(sizes - raw, kind="stable")[: n - sizes.sum()]] += 1
    return sizes


def stratified_split(labels: np.ndarray, fractions: Sequence[float], seed: int) -> Partition:
    """Split records into parts of the given fractions, each with the overall class mix.

    Owkin's 90/10 train/test then 40/40/20 of train, Kerkouche's 80/20 per hospital.
    """
    labels = _labels(labels)
    fractions_array = np.asarray(fractions, dtype=float)
    if fractions_array.ndim != 1 or not np.all(np.isfinite(fractions_array)):
        raise ValueError(f"fractions must be a list of finite numbers, got {fractions!r}")
    if np.any(fractions_array <= 0) or not np.isclose(fractions_array.sum(), 1.0):
        raise ValueError(f"fractions must be positive and sum to 1, got {fractions!r}")
    _check_count(len(labels), len(fractions_array), "parts")
    return _cut(_stratified_order(labels, np.random.default_rng(seed)), fractions_array)


def iid_stratified(labels: np.ndarray, n_silos: int, seed: int) -> Partition:
    """Equal-size silos (±1 record) with the overall class mix: the IID baseline."""
    labels = _labels(labels)
    _check_count(len(labels), n_silos, "silos")
    return _cut(_stratified_order(labels, np.random.default_rng(seed)), [1.0] * n_silos)


def dirichlet_label_skew(
    labels: np.ndarray, n_silos: int, alpha: float, seed: int, *, min_size: int = 1
) -> Partition:
    """Label skew: each class is spread over silos by proportions ~ Dirichlet(α).

    Small α gives silos dominated by a few classes; large α tends to IID. So that no
    silo is empty even at tiny α, each silo first gets `min_size` records drawn at
    random (not by label); the rest are spread by the Dirichlet draws.
    """
    labels = _labels(labels)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    _check_count(len(labels), n_silos, "silos")
    if min_size * n_silos > len(labels):
        raise ValueError(f"cannot give {n_silos} silos {min_size} records each from {len(labels)}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    parts = [[chunk] for chunk in np.split(order[: min_size * n_silos], n_silos)]
    rest = order[min_size * n_silos :]
    for c in np.unique(labels[rest]):
        members = rest[labels[rest] == c]
        sizes = _sizes(len(members), rng.dirichlet(np.full(n_silos, alpha)))
        for k, chunk in enumerate(np.split(members, np.cumsum(sizes)[:-1])):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def quantity_skew(
    n_records: int, n_silos: int, beta: float, seed: int, *, min_size: int = 1
) -> Partition:
    """Quantity skew: silo sizes ∝ Dirichlet(β) proportions, records assigned at random.

    Sizes are `min_size` plus a Dirichlet share of the rest, so no silo is empty.
    """
    if not np.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a positive finite number, got {beta!r}")
    _check_count(n_records, n_silos, "silos")
    if min_size * n_silos > n_records:
        raise ValueError(f"cannot give {n_silos} silos {min_size} records each from {n_records}")
    rng = np.random.default_rng(seed)
    sizes = min_size + _sizes(n_records - min_size * n_silos, rng.dirichlet(np.full(n_silos, beta)))
    order = rng.permutation(n_records)
    return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]


def natural(site_ids: np.ndarray | None, n_sites: int | None = None) -> Partition:
    """The real sites: silo k holds the records with site id k."""
    if site_ids is None:
        raise ValueError("this dataset has no site column; use a synthetic partition")
    site_ids = _labels(site_ids)
    n_sites = int(site_ids.max()) + 1 if n_sites is None else n_sites
    partition = [np.flatnonzero(site_ids == k) for k in range(n_sites)]
    empty = [k for k, p in enumerate(partition) if len(p) == 0]
    if empty:
        raise ValueError(f"sites {empty} have no records")
    return partition


def subdivide(partition: Partition, labels: np.ndarray, parts: int, seed: int) -> Partition:
    """Split every silo into `parts` stratified sub-silos (e.g. 4 ICU types x 3)."""
    labels = _labels(labels)
    rng = np.random.default_rng(seed)
    result: Partition = []
    for silo in partition:
        _check_count(len(silo), parts, "sub-silos")
        order = silo[_stratified_order(labels[silo], rng)]
        result += _cut(order, [1.0] * parts)
    return result


def per_silo_splits(
    partition: Partition, labels: np.ndarray, fractions: Sequence[float], seed: int
) -> list[list[np.ndarray]]:
    """Each silo's own stratified train/validation/test (or train/test) split.

    Returns `splits[silo][part]` as indices into the dataset; every silo must have at
    least one record per part (Kerkouche: [0.8, 0.2], then the union of test sets).
    """
    labels = _labels(labels)
    rng = np.random.default_rng(seed)
    result = []
    for k, silo in enumerate(partition):
        if len(silo) < len(fractions):
            raise ValueError(f"silo {k} has {len(silo)} records, fewer than {len(fractions)} parts")
        sub = stratified_split(labels[silo], fractions, int(rng.integers(2**63)))
        result.append([silo[p] for p in sub])
    return result


def patient_sides(
    units: np.ndarray, strata: np.ndarray, fractions: Sequence[float], seed: int
) -> list[np.ndarray]:
    """Records split by patient (`units`: each record's patient), all of a patient's
    records on one side: the patients split as one silo's stratified parts, each stratified
    by its first record's class or event. Returns each side's sorted record positions."""
    _, first, inverse = np.unique(units, return_index=True, return_inverse=True)
    sides = per_silo_splits([np.arange(len(first))], strata[first], list(fractions), seed)[0]
    return [np.flatnonzero(np.isin(inverse, side)) for side in sides]


def check_partition(partition: Partition, n_records: int) -> None:
    """Raise unless the silos cover each of `n_records` records exactly once."""
    counts = np.bincount(np.concatenate(partition), minlength=n_records)
    if len(counts) != n_records or not np.all(counts == 1):
        raise ValueError(
            f"not a partition of {n_records} records: {int(np.sum(counts == 0))} missing, "
            f"{int(np.sum(counts > 1))} repeated"
        )
