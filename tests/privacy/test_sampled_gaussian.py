"""The sampled Gaussian step on arrays is `dp_accounting`'s analysis, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution, privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl.errors import InternalError
from dpfl.privacy import accounting, events, sampled_gaussian
from dpfl.privacy.accounting import PLD_DISCRETISATION, RDP_ORDERS, NeighboringRelation

STEPS = [(1.1, 0.08), (0.6, 0.3), (3.0, 0.001), (0.8, 0.9)]
"""(σ, q): Kerkouche's hospitals, a large q at little noise, a tiny q, q near 1."""


@pytest.mark.parametrize(("sigma", "rate"), STEPS)
@pytest.mark.parametrize("adjacency", [sampled_gaussian.ADD, sampled_gaussian.REMOVE])
def test_delta_for_epsilon_is_dp_accountings(
    sigma: float, rate: float, adjacency: privacy_loss_mechanism.AdjacencyType
) -> None:
    """On a grid, at ε = 0 and on either side of each branch's bound ±log(1 - q), where
    dp_accounting's `math.isclose` sends the inverse privacy loss to ±∞."""
    bound = -np.log1p(-rate)
    near = bound * np.array([1 - 1e-8, 1 - 1e-10, 1, 1 + 1e-10])
    grid = np.concatenate([np.linspace(-3, 3, 2001), [0.0], near, -near])
    ours = sampled_gaussian.Loss(sigma, sampling_prob=rate, adjacency_type=adjacency)
    theirs = privacy_loss_mechanism.GaussianPrivacyLoss(
        sigma, sampling_prob=rate, adjacency_type=adjacency
    )
    expected = [theirs.get_delta_for_epsilon(e) for e in grid]
    np.testing.assert_array_equal(ours.get_delta_for_epsilon(grid), expected)


@pytest.mark.parametrize("adjacency", [sampled_gaussian.ADD, sampled_gaussian.REMOVE])
def test_a_loss_outside_the_mechanisms_range_is_an_internal_error(
    adjacency: privacy_loss_mechanism.AdjacencyType,
) -> None:
    """`get_delta_for_epsilon` inverts only the losses inside the range ±log(1 - q) leaves
    (the rest take their closed form): one outside reaching the inversion is dpfl's bug,
    never a privacy parameter's fault."""
    loss = sampled_gaussian.Loss(1.1, sampling_prob=0.08, adjacency_type=adjacency)
    outside = 2 * np.log1p(-0.08) * (-1 if adjacency is sampled_gaussian.ADD else 1)
    with pytest.raises(InternalError, match="outside the sampled mechanism's range"):
        loss._inverse_losses(np.array([0.0, outside]))


@pytest.mark.parametrize(("sigma", "rate"), STEPS)
def test_step_pld_is_dp_accountings(sigma: float, rate: float) -> None:
    ref = privacy_loss_distribution.from_gaussian_mechanism(
        sigma, value_discretization_interval=PLD_DISCRETISATION, sampling_prob=rate
    )
    built = accounting._gaussian_pld(
        sigma, rate, NeighboringRelation.ADD_OR_REMOVE_ONE, PLD_DISCRETISATION
    )
    for theirs, ours in zip(accounting._pmfs(ref), accounting._pmfs(built), strict=True):
        dense = theirs.to_dense_pmf()
        assert ours._lower_loss == dense._lower_loss
        assert ours._infinity_mass == dense._infinity_mass
        np.testing.assert_array_equal(ours._probs, dense._probs)


@pytest.mark.parametrize("rate", [1e-4, 0.0036, 0.08, 0.3, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("sigma", [0.25, 0.63, 1.08, 2.0, 50.0])
def test_rdp_is_dp_accountings(rate: float, sigma: float) -> None:
    """At every order dpfl uses, integer (to 4096) and fractional, including the orders
    whose series does not converge (∞ in both: at q = 0.3, σ = 1.08, sixteen of them)."""
    orders = np.array(RDP_ORDERS)
    expected = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(rate, sigma, orders)
    np.testing.assert_array_equal(sampled_gaussian.rdp(rate, sigma, orders), expected)


def test_rdp_edge_rates_and_noise() -> None:
    orders = np.array([1.5, 2.0, 32.0])
    np.testing.assert_array_equal(sampled_gaussian.rdp(0.0, 1.0, orders), 0.0)
    np.testing.assert_array_equal(sampled_gaussian.rdp(0.5, 0.0, orders), np.inf)
    np.testing.assert_array_equal(sampled_gaussian.rdp(1.0, 2.0, orders), orders / 8)
    for analysis in (  # σ² underflows: both refuse, as `epsilon` then says
        sampled_gaussian.rdp,
        rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian,
    ):
        with pytest.raises(ZeroDivisionError):
            analysis(0.5, 1e-300, orders)


def test_epsilon_is_what_dp_accountings_own_accountants_give() -> None:
    """Through `epsilon`, which takes the array paths, by either accountant."""
    step = events.poisson_gaussian(0.08, 1.1, steps=5)
    plan = events.repeat(step, 300)
    for kind in accounting.Accountant:
        ours = accounting.epsilon(plan, 1e-5, kind).epsilon
        if kind is accounting.Accountant.RDP:
            theirs = rdp_privacy_accountant.RdpAccountant(list(RDP_ORDERS))
        else:
            theirs = accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETISATION)
        theirs.compose(plan.dp_event)
        assert ours == theirs.get_epsilon(1e-5)
