"""Counts made consistent with their totals (`dpfl.analytics.consistency`)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from dpfl.analytics.consistency import consistent, integers, projected, simplex

GROUPS = [range(0, 3), range(4, 6), range(6, 10)]  # three breakdowns of the total at 3


def test_the_projection_is_the_least_squares_estimate_under_the_constraints() -> None:
    rng = np.random.default_rng(0)
    noisy = rng.normal(50.0, 10.0, 10)
    estimate, diagonal = projected(noisy, 3, GROUPS)
    for group in GROUPS:
        assert estimate[list(group)].sum() == pytest.approx(estimate[3])
    constraints = [{"type": "eq", "fun": lambda x, g=list(g): x[g].sum() - x[3]} for g in GROUPS]
    best = minimize(lambda x: np.sum((x - noisy) ** 2), noisy, constraints=constraints, tol=1e-12)
    np.testing.assert_allclose(estimate, best.x, atol=1e-5)
    # the projected noise's variance: the projector's diagonal, as measured
    draws = rng.normal(0.0, 1.0, (20_000, 10))
    spread = np.array([projected(d, 3, GROUPS)[0] for d in draws[:2000]]).var(axis=0)
    np.testing.assert_allclose(spread, diagonal, rtol=0.1)


def test_simplex_and_integers_keep_the_sum() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        values, total = rng.normal(3.0, 5.0, 6), int(rng.integers(0, 40))
        on = simplex(values, total)
        assert on.min() >= 0 and on.sum() == pytest.approx(total)
        whole = integers(on, total)
        assert whole.sum() == total and np.all(whole >= 0) and np.all(np.abs(whole - on) < 1)


def test_consistent_counts_are_non_negative_integers_adding_up_to_the_total() -> None:
    rng = np.random.default_rng(2)
    exact = np.array([30, 20, 0, 50, 45, 5, 0, 0, 10, 40], dtype=float)
    for _ in range(100):
        out = consistent(exact + rng.normal(0.0, 8.0, 10), 3, GROUPS)
        assert np.all(out >= 0) and np.all(out == np.round(out))
        assert all(out[list(g)].sum() == out[3] for g in GROUPS)
    assert np.all(consistent(exact - 1000.0, 3, GROUPS) == 0)  # a negative total: nothing
