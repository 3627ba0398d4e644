"""The figures a statistician reads, against the truth on a real cohort no one here made:
scikit-survival's FLCHAIN (7,874 people, integer ages and days, with ties)."""

from __future__ import annotations

import numpy as np
import pytest
from sksurv.datasets import load_flchain
from sksurv.nonparametric import kaplan_meier_estimator

from dpfl.analytics import KaplanMeier, Quantiles, Records

EDGES = tuple(365.0 * year for year in range(13))  # yearly, to 4,380 days


@pytest.fixture(scope="module")
def flchain() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    features, outcome = load_flchain()
    return features["age"].to_numpy(), outcome["futime"], outcome["death"]


def test_the_binned_curve_is_kaplan_meiers_at_every_edge(flchain) -> None:
    _, time, death = flchain
    assert np.sum(death & (time > EDGES[-1])) > 100  # deaths after the last edge
    km = KaplanMeier(EDGES)
    exact = km.vector(Records({}, time=time, event=death), 0, 1)
    figures = km.figures(exact, 0.0, [], np.random.default_rng(0))
    at, survival = kaplan_meier_estimator(death, time)
    for figure in figures:  # before: 0.7025 at the last edge, deaths after it counted in
        truth = survival[np.searchsorted(at, figure.at, side="right") - 1]
        assert figure.value == pytest.approx(truth, abs=5e-4)
    assert figures[-1].value == pytest.approx(0.7174, abs=5e-4)  # the 0.717


@pytest.mark.parametrize("std", [5.0, 20.0])
def test_quantile_intervals_cover_tied_integer_quantiles(flchain, std: float) -> None:
    age = flchain[0]
    query = Quantiles("age", tuple(np.arange(40.0, 111.0)), (0.01, 0.25, 0.5, 0.75, 0.99))
    truth = [np.quantile(age, p, method="inverted_cdf") for p in query.probabilities]
    exact = query.vector(Records({"age": age}), 0, 1)
    covered = []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        figures = query.figures(exact + rng.normal(0.0, std, exact.shape), std, [], rng)
        covered.append(
            [f.interval[0] <= t <= f.interval[1] for f, t in zip(figures, truth, strict=True)]
        )
    assert np.mean(covered, axis=0).min() >= 0.95  # before intervals of whole bins: 0–69%
