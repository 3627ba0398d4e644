"""The consortium-level ε of a patient seen by up to h hospitals (issue 40)."""

from __future__ import annotations

import itertools

import pytest
from dp_accounting import dp_event as dpe
from dp_accounting import pld

from dpfl.privacy import accounting, events
from dpfl.privacy.accounting import consortium_epsilon
from dpfl.privacy.calibration import calibrate_consortium_noise

DELTA = 1e-5


def _independent(plans: list[events.PrivacyEvent]) -> float:
    """ε of the plans composed by dp_accounting's own PLD accountant."""
    accountant = pld.PLDAccountant(value_discretization_interval=accounting.PLD_DISCRETISATION)
    accountant.compose(dpe.ComposedDpEvent([p.dp_event for p in plans]))
    return float(accountant.get_epsilon(DELTA))


PLANS = [
    events.poisson_gaussian(0.1, 1.2, steps=30),
    events.poisson_gaussian(0.05, 0.9, steps=60),
    events.gaussian(4.0),
    events.poisson_gaussian(0.2, 1.5, steps=20),
]


def test_the_worst_pair_composed_equals_dp_accountings_composition() -> None:
    found = consortium_epsilon(PLANS, 2, DELTA)
    expected = max(_independent(list(pair)) for pair in itertools.combinations(PLANS, 2))
    assert found.exact and found.hospitals == 2
    assert found.epsilon == pytest.approx(expected, rel=1e-6)
    assert found.epsilon == pytest.approx(_independent([PLANS[i] for i in found.worst]), rel=1e-6)
    # composition, not a sum of ε's
    alone = sorted(accounting.epsilon(p, DELTA).epsilon for p in PLANS)
    assert found.epsilon < alone[-1] + alone[-2]


def test_the_worst_subset_need_not_be_the_largest_alone() -> None:
    """Two Gaussians compose sub-linearly, a pure-ε event adds in full: the worst pair
    holds the pure-ε silo, whose ε alone is the smallest."""
    sigma = 4.6
    gauss = events.gaussian(sigma)
    pure = events.approximate_dp(0.9 * accounting.epsilon(gauss, DELTA).epsilon, 0.0)
    found = consortium_epsilon([gauss, gauss, pure], 2, DELTA)
    assert set(found.worst) == {0, 2} or set(found.worst) == {1, 2}
    assert found.epsilon == pytest.approx(_independent([gauss]) + pure.dp_event.epsilon, rel=1e-6)
    assert found.epsilon > _independent([gauss, gauss])


def test_too_many_subsets_give_an_rdp_bound_above_every_subset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exact = consortium_epsilon(PLANS, 3, DELTA).epsilon
    monkeypatch.setattr(accounting, "CONSORTIUM_SUBSETS", 0)
    bound = consortium_epsilon(PLANS, 3, DELTA)
    assert not bound.exact and bound.accountant is accounting.Accountant.RDP
    assert exact <= bound.epsilon < 1.5 * exact


def test_identical_plans_and_h_past_the_silos() -> None:
    same = [events.poisson_gaussian(0.1, 1.0, steps=50)] * 30  # C(30, 3) subsets, one class
    found = consortium_epsilon(same, 3, DELTA)
    assert found.exact and found.worst == (0, 1, 2)
    assert found.epsilon == pytest.approx(_independent(same[:3]), rel=1e-6)
    assert consortium_epsilon(same[:2], 5, DELTA).hospitals == 2


def test_h_must_be_a_positive_integer() -> None:
    with pytest.raises(accounting.PrivacyParameterError, match="hospitals per patient"):
        consortium_epsilon(PLANS, 0, DELTA)


def test_calibration_to_the_consortium_target_is_the_least_noise() -> None:
    def plans(sigma: float) -> list[events.PrivacyEvent]:
        return [events.poisson_gaussian(q, sigma, steps=40) for q in (0.05, 0.1, 0.2)]

    sigma = calibrate_consortium_noise(3.0, DELTA, plans, 2, tolerance=1e-3)
    assert consortium_epsilon(plans(sigma), 2, DELTA).epsilon <= 3.0
    assert consortium_epsilon(plans(sigma - 1e-3), 2, DELTA).epsilon > 3.0
