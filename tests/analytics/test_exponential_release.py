"""The exponential mechanism's quantiles released by each hospital (`ExponentialQuantiles`,
a `LocalQuery`): charged as its pure ε beside the Gaussian releases, drawn from the
research generator or the CSPRNG, and counted in the run's calibration."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpfl.analytics import Count, ExponentialQuantiles, LocalQuery, Records, describe, plan_event
from dpfl.analytics.exponential import draws
from dpfl.local.noise import SecureNoise, SeededNoise
from dpfl.privacy import Budget, Ledger, epsilon
from dpfl.privacy.events import Neighbouring
from dpfl.secure import InTheClear

QUERY = ExponentialQuantiles("age", (0.0, 120.0), (0.25, 0.5, 0.75), 0.5)


def _cohort(patients: bool = False) -> dict[str, Records]:
    rng = np.random.default_rng(4)
    return {
        name: Records(
            {"age": np.round(rng.normal(mean, 12.0, 400))},
            units=np.repeat(np.arange(200), 2) if patients else None,
        )
        for name, mean in (("east", 50.0), ("west", 70.0))
    }


def _describe(tmp_path: Path, cohort: dict[str, Records], max_records: int | None = None):
    neighbouring = Neighbouring.ADD_REMOVE_PATIENT if max_records else Neighbouring.ADD_REMOVE
    book = Ledger(tmp_path / "ledger.sqlite")
    book.register_silos({n: Budget(math.inf, 1e-5, neighbouring, None) for n in cohort})
    with book:
        run = describe(
            cohort,
            [Count(), QUERY],
            4.0,
            ledger=book,
            accounts={n: [n] for n in cohort},
            summing=InTheClear(),
            rng=np.random.default_rng(0),
            max_records=max_records,
        )
        charged = {n: [e.event for e in book.entries(n)] for n in cohort}
    return run, charged


def test_each_hospital_releases_its_own_quantiles_charged_at_their_pure_epsilon(
    tmp_path: Path,
) -> None:
    assert isinstance(QUERY, LocalQuery)
    cohort = _cohort()
    run, charged = _describe(tmp_path, cohort)
    for name, records in cohort.items():
        gaussian, local = charged[name]
        assert "Gaussian(σ=4)" in gaussian.describe() and "ε=0.5, δ=0" in local.describe()
        for p in QUERY.probabilities:
            (figure,) = [f for f in run.figures if f.name == f"hospital {name}: quantile {p:g}"]
            assert abs(figure.value - np.quantile(records.column("age"), p)) < 3
            assert math.isnan(figure.std) and figure.band is None  # no interval is claimed
    assert "exponential quantiles of age" not in run.noise  # no Gaussian noise of its own


def test_a_patient_costs_epsilon_so_each_record_gets_its_share(tmp_path: Path) -> None:
    _, charged = _describe(tmp_path, _cohort(patients=True), max_records=2)
    local = charged["east"][1]
    assert local.neighbouring is Neighbouring.ADD_REMOVE_PATIENT
    assert "ε=0.5, δ=0" in local.describe()
    block = QUERY.sample(np.arange(10.0), 1, 2, 2, np.random.default_rng(0))
    assert np.all(block[:3] == 0) and np.all(block[3:] > 0)  # its own place of two


def test_the_calibration_leaves_room_for_the_local_epsilon() -> None:
    plan = plan_event([Count(), QUERY], 3.0, Neighbouring.ADD_REMOVE)
    alone = plan_event([Count()], 3.0, Neighbouring.ADD_REMOVE)
    spent, without = (epsilon(e, 1e-5, "pld").epsilon for e in (plan, alone))
    assert spent == pytest.approx(without + 0.5, rel=1e-6)  # basic composition on top


def test_a_noise_source_draws_gumbels_and_uniforms_of_the_right_law() -> None:
    secure = draws(SeededNoise(3))  # a deployed hospital's CSPRNG draws as a NoiseSource
    gumbels = secure.gumbel(size=(20_000,))
    assert stats.kstest(gumbels, "gumbel_r").pvalue > 1e-3
    uniforms = secure.uniform(np.full(20_000, 2.0), np.full(20_000, 5.0))
    assert stats.kstest((uniforms - 2.0) / 3.0, "uniform").pvalue > 1e-3
    assert 2.0 <= float(secure.uniform(2.0, 5.0)) <= 5.0
    x = np.round(np.random.default_rng(1).normal(60, 10, 500))
    drawn = QUERY.sample(x, 0, 1, 1, SecureNoise())
    assert np.all(np.diff(drawn) >= 0) and abs(drawn[1] - np.median(x)) < 3
