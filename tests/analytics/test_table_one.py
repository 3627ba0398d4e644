"""Table 1 under DP (`dpfl.analytics.table_one`) on FLCHAIN split into three hospitals:
its noiseless figures are the exact ones, one person moves it by at most Δ, and its
cells' intervals cover."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from sksurv.datasets import load_flchain

from dpfl.analytics import Z95, Continuous, Records, TableOne

TABLE = TableOne(
    "sex",
    ("F",),  # "M" falls in "other": a group not declared is still counted
    (("mgus", ("no", "yes")), ("chapter", ("Circulatory", "Neoplasms"))),
    (Continuous("age", (50.0, 100.0), tuple(np.arange(50.0, 101.0))),),
)
HOSPITALS = ("east", "north", "south")


@pytest.fixture(scope="module")
def hospitals() -> dict[str, Records]:
    features, _ = load_flchain()
    columns = {
        "sex": features["sex"].astype(str).to_numpy(dtype=object),
        "mgus": features["mgus"].astype(str).to_numpy(dtype=object),
        "chapter": features["chapter"].astype(str).fillna("").to_numpy(dtype=object),
        "age": features["age"].to_numpy(),
    }
    site = np.arange(len(features)) % 3
    whole = Records(columns)
    return {name: whole.take(np.flatnonzero(site == k)) for k, name in enumerate(HOSPITALS)}


def _pooled(hospitals: dict[str, Records]) -> np.ndarray:
    return sum(TABLE.vector(r, k, 3) for k, r in enumerate(hospitals.values()))


def test_noiseless_cells_are_the_exact_figures(hospitals) -> None:
    figures = TABLE.figures(_pooled(hospitals), 0.0, HOSPITALS, np.random.default_rng(0))
    at = {(f.name, f.cell): f.value for f in figures}
    sites = {**hospitals, "pooled": None}
    for site, records in sites.items():
        if records is None:
            records = Records(
                {
                    c: np.concatenate([r.values(c) for r in hospitals.values()])
                    for c in ("sex", "mgus", "chapter", "age")
                }
            )
        sex = records.values("sex")
        for group, keep in (("F", sex == "F"), ("other", sex != "F"), ("all", sex == sex)):
            mine = records.take(np.flatnonzero(keep))
            age = np.clip(mine.values("age").astype(float), 50, 100)
            cell = (site, group)
            assert at[("n", cell)] == len(mine)
            assert at[("mgus = yes", cell)] == np.sum(mine.values("mgus") == "yes")
            chapter = mine.values("chapter")
            other = len(mine) - np.sum(chapter == "Circulatory") - np.sum(chapter == "Neoplasms")
            assert at[("chapter = other", cell)] == other
            share = 100 * np.mean(mine.values("mgus") == "no")
            assert at[("mgus = no (%)", cell)] == pytest.approx(share)
            assert at[("age: mean", cell)] == pytest.approx(age.mean())
            assert at[("age: standard deviation", cell)] == pytest.approx(age.std())
            median = np.quantile(age, 0.5, method="inverted_cdf")
            assert abs(at[("age: quantile 0.5", cell)] - median) <= 1.0  # a bin's width


def test_one_person_moves_the_vector_by_at_most_its_sensitivity(hospitals) -> None:
    records = hospitals["north"]
    whole = TABLE.vector(records, 1, 3)
    for drop in (0, 1, 7, 100):
        keep = np.setdiff1d(np.arange(len(records)), [drop])
        moved = np.linalg.norm(whole - TABLE.vector(records.take(keep), 1, 3))
        assert 1.0 < moved <= TABLE.sensitivity + 1e-12
    assert TABLE.sensitivity == pytest.approx(np.sqrt(2 * (1 + 2 + 2.25)))


def test_the_cells_intervals_cover_the_exact_figures(hospitals) -> None:
    exact = _pooled(hospitals)
    rng = np.random.default_rng(0)
    truth = {(f.name, f.cell): f.value for f in TABLE.figures(exact, 0.0, HOSPITALS, rng)}
    std = 8.0 * TABLE.sensitivity * np.sqrt(3)  # σ = 8 at three hospitals
    checked = {
        ("n", ("pooled", "F")),
        ("age: mean", ("east", "F")),
        ("mgus = yes", ("north", "all")),
    }
    checked |= {("age: quantile 0.5", ("pooled", "all")), ("age: quantile 0.25", ("south", "F"))}
    covered: dict[tuple, list[bool]] = {key: [] for key in checked}
    for seed in range(1500):
        rng = np.random.default_rng(seed)
        noisy = exact + rng.normal(0.0, std, exact.shape)
        for f in TABLE.figures(noisy, std, HOSPITALS, rng):
            if (f.name, f.cell) in covered:
                low, high = f.interval or (f.value - Z95 * f.std, f.value + Z95 * f.std)
                covered[(f.name, f.cell)].append(low <= truth[(f.name, f.cell)] <= high)
    rates = {key: np.mean(hits) for key, hits in covered.items()}
    for key, rate in rates.items():
        if "quantile" in key[0]:
            assert rate >= 0.93, (key, rate)  # whole bins: conservative
        else:
            assert 0.93 <= rate <= 0.97, (key, rate)


def test_consistent_cells_are_non_negative_integers_that_add_up(hospitals) -> None:
    table = replace(TABLE, consistent=True)
    exact = _pooled(hospitals)
    rng = np.random.default_rng(3)
    std = 20.0
    figures = table.figures(exact + rng.normal(0.0, std, exact.shape), std, HOSPITALS, rng)
    at = {(f.name, f.cell): f for f in figures}
    for cell in {f.cell for f in figures}:
        n = at[("n", cell)].value
        for column, levels in table.categorical:
            counts = [at[(f"{column} = {level}", cell)].value for level in (*levels, "other")]
            assert all(c >= 0 and c == int(c) for c in counts) and sum(counts) == n
        assert not at[("n", cell)].raw
    for site in (*HOSPITALS, "pooled"):
        groups = [at[("mgus = yes", (site, g))].value for g in ("F", "other")]
        assert at[("mgus = yes", (site, "all"))].value == sum(groups)
