"""ε lower bounds from counts: exact Clopper–Pearson ends, the closed forms at perfect
separation, and coverage: on a mechanism whose ε is known, the bound passes it in at
most 5 % of repetitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpfl.audit.bounds import (
    clopper_pearson,
    one_run_epsilon,
    one_run_p_value,
    two_world_epsilon,
)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (17, 400)])
def test_one_sided_bounds_are_the_ends_of_the_exact_interval(k: int, n: int) -> None:
    lower, upper = clopper_pearson(k, n, 0.025)
    exact = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert lower == pytest.approx(exact.low, abs=1e-12)
    assert upper == pytest.approx(exact.high, abs=1e-12)


def test_perfect_separation_has_a_closed_form() -> None:
    n, delta, alpha = 500, 1e-5, 0.025
    found = float(two_world_epsilon(n, n, 0, n, delta))
    assert found == pytest.approx(math.log((alpha ** (1 / n) - delta) / (1 - alpha ** (1 / n))))
    assert float(two_world_epsilon(0, n, 0, n, delta)) == 0.0  # a test that flags nothing
    assert float(two_world_epsilon(n // 2, n, n // 2, n, delta)) == 0.0  # a coin


def randomized_response(epsilon: float, size: tuple[int, ...], seed: int) -> np.ndarray:
    """Answers of ε-DP randomised response to "was the canary in?" when it was."""
    rng = np.random.default_rng(seed)
    return rng.random(size) < math.exp(epsilon) / (1 + math.exp(epsilon))


def test_two_world_bound_covers_randomised_response() -> None:
    epsilon, n, repeats = 1.0, 2000, 400
    true_positives = randomized_response(epsilon, (repeats, n), 0).sum(1)
    false_positives = n - randomized_response(epsilon, (repeats, n), 1).sum(1)
    bounds = two_world_epsilon(true_positives, n, false_positives, n, 0.0)
    assert np.mean(bounds > epsilon) <= 0.05
    assert np.median(bounds) > 0.8  # and it is tight: the counts are rich


def test_one_run_bound_without_delta_is_the_binomial_tail() -> None:
    # all r guesses right: P[Binomial(r, q) ≥ r] = q^r = 0.05 at the bound
    r = 100
    q = 0.05 ** (1 / r)
    assert one_run_epsilon(r, r, r, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    assert one_run_p_value(r, r, r, 1.0, 0.0) == pytest.approx(
        stats.binom.sf(r - 1, r, 1 / (1 + math.exp(-1)))
    )
    assert one_run_epsilon(r, r, r // 2, 1e-5) == 0.0  # chance level refutes nothing


def test_delta_only_loosens_the_one_run_bound() -> None:
    bounds = [one_run_epsilon(1000, 200, 180, delta) for delta in (0.0, 1e-6, 1e-4)]
    assert bounds[0] > bounds[1] > bounds[2] > 0


def test_one_run_bound_covers_randomised_response() -> None:
    epsilon, m, repeats = 1.0, 500, 100
    correct = randomized_response(epsilon, (repeats, m), 2).sum(1)
    bounds = [one_run_epsilon(m, m, int(v), 0.0) for v in correct]
    assert np.mean(np.array(bounds) > epsilon) <= 0.05
    assert np.median(bounds) > 0.7
