"""Survival metrics: survival curves from hazard logits, the risk that ranks patients,
and NaN (never a made-up number) where a metric is undefined."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sksurv.metrics import concordance_index_censored, integrated_brier_score
from sksurv.util import Surv

from dpfl.federation.survival_metrics import (
    expected_survival,
    survival_curves,
    survival_metrics,
)

CUTS = (10.0, 20.0, 30.0)


def logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1 - p))


def test_survival_curves_multiply_the_hazards_of_the_completed_intervals() -> None:
    hazards = np.array([[0.1, 0.2, 0.5, 0.9]])
    curves = survival_curves(logit(hazards), CUTS, np.array([0.0, 9.9, 10.0, 25.0, 30.0, 99.0]))
    expected = [1.0, 1.0, 0.9, 0.9 * 0.8, 0.9 * 0.8 * 0.5, 0.9 * 0.8 * 0.5]
    assert np.allclose(curves[0], expected)


def test_higher_hazards_rank_as_higher_risk_and_metrics_match_scikit_survival() -> None:
    rng = np.random.default_rng(0)
    n = 200
    frailty = rng.uniform(0.05, 0.6, size=n)  # each patient's constant hazard per interval
    # time drawn from the patient's own discrete hazard: a model that knows it ranks well
    interval = rng.geometric(frailty) - 1
    time = np.minimum(interval, 3) * 10.0 + rng.uniform(0, 10, size=n)
    event = (rng.random(n) < 0.7).astype(float)
    labels = np.column_stack([time, event])
    outputs = logit(np.repeat(frailty[:, None], 4, axis=1))
    got = survival_metrics(labels, outputs, CUTS)
    assert got["c_index"] > 0.6
    truth = Surv.from_arrays(event.astype(bool), time)
    # −RMST ranks exactly as the constant hazard does
    harrell = concordance_index_censored(event.astype(bool), time, frailty)[0]
    assert got["c_index"] == pytest.approx(harrell)
    grid = np.array([10.0, 20.0, 30.0])
    grid = grid[grid < time.max()]
    ibs = integrated_brier_score(truth, truth, survival_curves(outputs, CUTS, grid), grid)
    assert got["ibs"] == pytest.approx(ibs)
    assert 0.5 < got["td_auc"] <= 1 and 0.5 < got["c_index_uno"] <= 1


def test_a_risk_score_gets_concordance_and_td_auc_but_no_brier_score() -> None:
    rng = np.random.default_rng(1)
    risk = rng.normal(size=100)
    time = rng.exponential(np.exp(-risk))
    labels = np.column_stack([time, np.ones(100)])
    got = survival_metrics(labels, risk[:, None], None)
    assert got["c_index"] > 0.6 and got["td_auc"] > 0.6
    assert math.isnan(got["ibs"])  # a Cox score has no survival curve


def test_undefined_metrics_are_nan() -> None:
    labels = np.column_stack([np.arange(1.0, 6.0), np.zeros(5)])  # all censored
    got = survival_metrics(labels, np.zeros((5, 4)), CUTS)
    assert all(math.isnan(v) for v in got.values())


def test_bad_outputs_are_refused() -> None:
    labels = np.column_stack([np.arange(1.0, 6.0), np.ones(5)])
    with pytest.raises(ValueError, match="NaN"):
        survival_metrics(labels, np.full((5, 4), np.nan), CUTS)
    with pytest.raises(ValueError, match="need 3 cuts"):
        survival_metrics(labels, np.zeros((5, 4)), (10.0,))
    with pytest.raises(ValueError, match="time, event"):
        survival_metrics(labels[:, 0], np.zeros((5, 1)), None)


def test_every_intervals_hazard_moves_the_ranking_the_open_one_included() -> None:
    """With a single cut the patients differ only in their hazards, and C must see them
    (a risk read from interval starts alone gave 0.5 whatever the model)."""
    rng = np.random.default_rng(2)
    n = 300
    risky = rng.random(n) < 0.5
    time = np.where(risky, rng.exponential(800, n), rng.exponential(3000, n))
    labels = np.column_stack([time, np.ones(n)])
    for risky_hazards, safe_hazards in (([0.4, 0.2], [0.1, 0.2]), ([0.2, 0.6], [0.2, 0.1])):
        outputs = np.where(
            risky[:, None], logit(np.array([risky_hazards])), logit(np.array([safe_hazards]))
        )
        assert survival_metrics(labels, outputs, (1825.0,))["c_index"] > 0.6


def test_expected_survival_is_exact_for_a_constant_hazard() -> None:
    constant = logit(np.full((1, 4), 0.25))  # unit-wide intervals, S(k) = 0.75^k
    exact = sum(0.75**k for k in range(400)) - 0.5  # the trapezoid rule's sum
    assert expected_survival(constant, (1.0, 2.0, 3.0))[0] == pytest.approx(exact, rel=1e-9)
