"""Each statistic's sensitivity and law: a neighbouring dataset (one record, or one
patient's records, added or removed) moves the true vector by at most the declared
sensitivity, and the released figure's empirical spread matches its declared noise."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpfl.analytics import (
    Count,
    Histogram,
    KaplanMeier,
    Mean,
    Quantiles,
    Records,
    bounded,
    describe,
    pooled,
)
from dpfl.privacy import Budget, Ledger
from dpfl.privacy.events import Neighbouring
from dpfl.secure import InTheClear, by_name
from dpfl.secure.masking import MaskedInput, PairwiseMasking

QUERIES = [
    Count((0, 1), {"grade": (1.0, 2.0)}),
    Histogram("age", (20.0, 40.0, 60.0, 80.0)),
    Mean("age", (20.0, 80.0)),
    Quantiles("age", tuple(np.linspace(0, 100, 21))),
    KaplanMeier((0.0, 1.0, 2.0, 5.0)),
]


def _records(rng: np.random.Generator, n: int = 60, patients: bool = False) -> Records:
    return Records(
        {"age": rng.uniform(0, 110, n), "grade": rng.integers(0, 4, n).astype(float)},
        labels=rng.integers(0, 2, n),
        time=rng.exponential(2.0, n),
        event=rng.integers(0, 2, n),
        units=rng.integers(0, n // 3, n) if patients else None,
    )


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.title)
def test_removing_one_record_moves_the_vector_by_at_most_the_sensitivity(query) -> None:
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(50):
        data = _records(rng)
        for i in range(len(data)):
            neighbour = data.take(np.delete(np.arange(len(data)), i))
            moved = query.vector(data, 1, 3) - query.vector(neighbour, 1, 3)
            worst = max(worst, float(np.linalg.norm(moved)))
    assert worst <= query.sensitivity + 1e-9
    assert worst >= 0.5 * query.sensitivity  # the bound is not loose by far


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.title)
def test_removing_one_patient_moves_the_bounded_vector_by_at_most_max_records_times(query) -> None:
    rng = np.random.default_rng(1)
    m = 2
    for _ in range(20):
        data = _records(rng, patients=True)
        kept = bounded(data, m)
        assert np.bincount(kept.units).max() <= m
        for patient in np.unique(data.units):
            without = bounded(data.take(np.flatnonzero(data.units != patient)), m)
            moved = query.vector(kept, 0, 2) - query.vector(without, 0, 2)
            assert np.linalg.norm(moved) <= m * query.sensitivity + 1e-9


def _ledger(tmp_path: Path, names: list[str]) -> Ledger:
    book = Ledger(tmp_path / "ledger.sqlite")
    book.register_silos({n: Budget(math.inf, 1e-5, Neighbouring.ADD_REMOVE, None) for n in names})
    return book


@pytest.mark.parametrize("query", QUERIES[:3], ids=lambda q: q.title)
def test_the_pooled_figures_spread_as_their_declared_noise(query, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    cohort = {name: _records(rng) for name in ("a", "b", "c")}
    sigma = 2.0
    with _ledger(tmp_path, list(cohort)) as book:
        runs = [
            describe(
                cohort,
                [query],
                sigma,
                ledger=book,
                accounts={n: [n] for n in cohort},
                summing=InTheClear(),
                rng=np.random.default_rng(seed),
            )
            for seed in range(300)
        ]
    declared = sigma * query.sensitivity * math.sqrt(3)
    first = runs[0].figures[0]
    assert first.std == pytest.approx(declared)
    values = np.array([r.figures[0].value for r in runs])
    assert values.std() == pytest.approx(declared, rel=0.15)
    exact = sum(query.vector(r, k, 3) for k, r in enumerate(cohort.values()))[0]
    assert values.mean() == pytest.approx(exact, abs=4 * declared / math.sqrt(300))


def test_the_mean_std_declared_matches_its_spread(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    cohort = {name: _records(rng, n=400) for name in ("a", "b")}
    query = Mean("age", (20.0, 80.0))
    with _ledger(tmp_path, list(cohort)) as book:
        means = [
            describe(
                cohort,
                [query],
                1.0,
                ledger=book,
                accounts={n: [n] for n in cohort},
                summing=InTheClear(),
                rng=np.random.default_rng(seed),
            ).figures[1]
            for seed in range(300)
        ]
    assert np.std([m.value for m in means]) == pytest.approx(means[0].std, rel=0.2)


def test_masking_reveals_only_the_pooled_vector() -> None:
    rng = np.random.default_rng(4)
    noisy = {name: rng.normal(100.0, 10.0, 5) for name in ("a", "b", "c")}
    masking = PairwiseMasking(bits=64, scale=2.0**16, clip=2.0**40)
    total = pooled(noisy, masking)
    np.testing.assert_allclose(total, sum(noisy.values()), atol=1e-3)
    seen = masking.run({n: torch.from_numpy(v) for n, v in noisy.items()})
    words = [m for m in seen.server_received if isinstance(m, MaskedInput)]
    assert len(words) == 3
    plain = [masking.codec.encode(v) for v in noisy.values()]
    for message in words:  # the server holds no hospital's vector, only masked words
        assert not any(np.array_equal(message.words, p) for p in plain)
        assert np.abs(message.words.astype(np.float64) / 2.0**16).min() > 1e4


def test_a_quantiles_interval_covers_its_noiseless_value(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    cohort = {name: _records(rng, n=200) for name in ("a", "b", "c")}
    query = Quantiles("age", tuple(np.linspace(0, 120, 25)), (0.25, 0.5, 0.75))
    exact = sum(query.vector(r, 0, 3) for r in cohort.values())
    truth = [f.value for f in query.figures(exact, 0.0, [], rng)]
    ages = np.concatenate([r.column("age") for r in cohort.values()])
    assert truth[1] == pytest.approx(np.median(ages), abs=5.0)  # the bins' resolution
    covered = []
    with _ledger(tmp_path, list(cohort)) as book:
        for seed in range(100):
            run = describe(
                cohort,
                [query],
                3.0,
                ledger=book,
                accounts={n: [n] for n in cohort},
                summing=InTheClear(),
                rng=np.random.default_rng(seed),
            )
            covered += [
                f.interval[0] <= t <= f.interval[1]
                for f, t in zip(run.figures, truth, strict=True)
                if f.interval is not None
            ]
    assert len(covered) == 300 and np.mean(covered) >= 0.9


def test_he_sums_the_noisy_vectors() -> None:
    rng = np.random.default_rng(6)
    noisy = {name: rng.normal(500.0, 100.0, 7) for name in ("a", "b", "c")}
    np.testing.assert_allclose(pooled(noisy, by_name("he")), sum(noisy.values()), atol=1e-6)


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.title)
def test_each_query_declares_its_vectors_length(query) -> None:
    """The length a secure sum is set up for before any record is read (a deployment)."""
    for hospitals in (1, 4):
        vector = query.vector(_records(np.random.default_rng(7)), 0, hospitals)
        assert len(vector) == query.length(hospitals)
