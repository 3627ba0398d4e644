"""Partitions cover every record exactly once, are deterministic, and refuse bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.data import partition, public_tables

LABELS = np.repeat([0, 1, 2], [600, 300, 100])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    n_silos=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    alpha=st.floats(0.05, 100),
)
def test_every_partition_covers_each_record_once(n_silos: int, seed: int, alpha: float) -> None:
    for parts in (
        partition.iid_stratified(LABELS, n_silos, seed),
        partition.dirichlet_label_skew(LABELS, n_silos, alpha, seed),
        partition.quantity_skew(len(LABELS), n_silos, alpha, seed),
    ):
        assert len(parts) == n_silos
        partition.check_partition(parts, len(LABELS))
        assert min(len(p) for p in parts) >= 1


def test_partitions_are_deterministic_by_seed() -> None:
    def draws(seed: int) -> list[list[np.ndarray]]:
        return [
            partition.iid_stratified(LABELS, 5, seed),
            partition.dirichlet_label_skew(LABELS, 5, 0.5, seed),
            partition.quantity_skew(len(LABELS), 5, 0.5, seed),
            partition.stratified_split(LABELS, [0.9, 0.1], seed),
        ]

    first, again, other = draws(7), draws(7), draws(8)
    for a, b, c in zip(first, again, other, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not all(np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def test_iid_stratified_balances_sizes_and_classes() -> None:
    parts = partition.iid_stratified(LABELS, 7, seed=3)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for p in parts:
        share = np.bincount(LABELS[p], minlength=3) / len(p)
        assert np.allclose(share, [0.6, 0.3, 0.1], atol=0.02)


def test_dirichlet_alpha_controls_label_skew() -> None:
    def mean_tv(alpha: float) -> float:
        parts = partition.dirichlet_label_skew(LABELS, 10, alpha, seed=0)
        shares = [np.bincount(LABELS[p], minlength=3) / len(p) for p in parts]
        return float(np.mean([0.5 * np.abs(s - [0.6, 0.3, 0.1]).sum() for s in shares]))

    assert mean_tv(0.1) > 0.3 > 0.05 > mean_tv(1000.0)


def test_quantity_skew_beta_controls_sizes() -> None:
    skewed = [len(p) for p in partition.quantity_skew(10_000, 10, 0.2, seed=0)]
    even = [len(p) for p in partition.quantity_skew(10_000, 10, 1000.0, seed=0)]
    assert np.std(skewed) > 5 * np.std(even)


def test_owkin_and_kerkouche_splits() -> None:
    labels = np.repeat([0, 1], [61, 529])  # BC-TCGA: 61 normal, 529 tumour
    train, test = partition.stratified_split(labels, [0.9, 0.1], seed=0)
    assert (len(train), len(test)) == (531, 59)
    assert np.bincount(labels[test]).tolist() == [6, 53]
    client1, client2, holdout = partition.stratified_split(labels[train], [0.4, 0.4, 0.2], seed=1)
    assert sorted([len(client1), len(client2)]) == [212, 213] and len(holdout) == 106
    silos = partition.quantity_skew(5000, 8, 2.0, seed=0)
    splits = partition.per_silo_splits(silos, np.zeros(5000, dtype=np.int64), [0.8, 0.2], seed=0)
    for silo, (tr, te) in zip(silos, splits, strict=True):
        assert len(te) == round(0.2 * len(silo))
        assert np.array_equal(np.sort(np.concatenate([tr, te])), silo)


def test_natural_split_and_subdivision(shared_data: Path) -> None:
    data = public_tables.heart_disease(shared_data / "uci_heart_disease")
    sites = partition.natural(data.site_ids)
    assert [len(s) for s in sites] == [303, 294, 123, 200]
    finer = partition.subdivide(sites, data.labels, 3, seed=0)
    assert len(finer) == 12
    partition.check_partition(finer, len(data))
    assert [len(s) for s in finer[:3]] == [101, 101, 101]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: partition.iid_stratified(LABELS, 1001, 0), "1001 silos from 1000 records"),
        (lambda: partition.iid_stratified(LABELS, 0, 0), "positive integer"),
        (lambda: partition.dirichlet_label_skew(LABELS, 3, 0.0, 0), "alpha must be a positive"),
        (lambda: partition.dirichlet_label_skew(LABELS, 3, float("nan"), 0), "alpha"),
        (lambda: partition.dirichlet_label_skew(LABELS, 10, 0.1, 0, min_size=101), "101 records"),
        (lambda: partition.quantity_skew(10, 3, -1.0, 0), "beta must be a positive"),
        (lambda: partition.stratified_split(LABELS, [0.5, 0.6], 0), "sum to 1"),
        (lambda: partition.iid_stratified(LABELS.astype(float), 2, 0), "integer array"),
        (lambda: partition.natural(None), "no site column"),
        (lambda: partition.natural(np.array([0, 2])), r"sites \[1\] have no records"),
        (lambda: partition.per_silo_splits([np.array([0])], LABELS, [0.8, 0.2], 0), "fewer"),
        (lambda: partition.check_partition([np.array([0, 0])], 2), "1 missing, 1 repeated"),
    ],
)
def test_bad_partition_requests_are_refused(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]
