"""Dopamine's DP-FedSGD: learns, charges the server view, records the hospital view,
spreads σ over K silos as Lemma 1 says, and stops before passing the budget."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import FedSGDSecure
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression

Silos = Callable[[int], list[Silo]]


def _dopamine(sigma: float, momentum: float = 0.9) -> FedSGDSecure:
    torch.manual_seed(0)
    config = DPSGDConfig(
        clip_norm=1.0, noise_multiplier=sigma, learning_rate=0.5, momentum=momentum
    )
    return FedSGDSecure(model=logistic_regression(30), loss=bce, dpsgd=config)


def test_learns_and_charges_the_server_and_hospital_views(
    breast_cancer_silos: Silos, independent_epsilon: Callable[..., float]
) -> None:
    silos = breast_cancer_silos(3)
    result = simulate(_dopamine(1.0), silos, rounds=30, epsilon_budget=50.0, progress=False)
    assert not result.stopped_by_budget
    assert result.final_metrics()["accuracy"] > 0.9
    first = silos[0]  # checked against an independent composition; the others alike
    server = result.epsilon[0][first.name].epsilon
    hospitals = result.views[0][first.name]["hospitals"].epsilon
    assert server == pytest.approx(independent_epsilon(1.0, 16 / first.size, 30), rel=1e-9)
    assert hospitals == pytest.approx(
        independent_epsilon(math.sqrt(2 / 3), 16 / first.size, 30), rel=1e-9
    )
    for silo in silos:
        assert (
            result.views[0][silo.name]["hospitals"].epsilon > result.epsilon[0][silo.name].epsilon
        )


def test_stops_before_the_round_that_would_pass_the_budget(
    breast_cancer_silos: Silos, independent_epsilon: Callable[..., float]
) -> None:
    silos = breast_cancer_silos(3)
    result = simulate(_dopamine(2.0), silos, rounds=10_000, epsilon_budget=1.0, progress=False)
    assert result.stopped_by_budget
    done = result.rounds_completed
    assert 0 < done < 10_000
    worst = min(silos, key=lambda s: s.size)  # largest q: the first to run out
    assert result.epsilon[0][worst.name].epsilon <= 1.0
    assert independent_epsilon(2.0, 16 / worst.size, done + 1) > 1.0
    with pytest.raises(ValueError, match="no further round fits"):
        simulate(_dopamine(1.0), silos, rounds=5, epsilon_budget=1.0, progress=False)


def test_the_mean_of_k_shares_has_the_noise_of_central_dp_sgd(breast_cancer_silos: Silos) -> None:
    """Lemma 1: each silo adds N(0, σ²C²/K) to its clipped sum and divides by B, so the
    mean of the K updates carries noise std η·σC/(K·B) per coordinate — for one record's
    sensitivity ηC/(K·B), the multiplier σ of central DP-SGD. Measured as the difference
    between a run and the same run (same batches, same clipping) without noise."""
    silos = breast_cancer_silos(3)
    sigma, trials = 2.0, 60
    noisy = simulate(
        _dopamine(sigma, 0.0),
        silos,
        rounds=1,
        trials=trials,
        seed=3,
        epsilon_budget=100.0,
        progress=False,
    )
    quiet = simulate(_dopamine(0.0, 0.0), silos, rounds=1, trials=trials, seed=3, progress=False)
    diff = torch.cat([(noisy.params[n] - quiet.params[n]).flatten() for n in noisy.params])
    expected = 0.5 * sigma * 1.0 / (3 * 16)
    assert diff.numel() == trials * 31
    assert float(diff.std()) == pytest.approx(expected, rel=0.06)
    assert abs(float(diff.mean())) < 4 * expected / math.sqrt(diff.numel())
