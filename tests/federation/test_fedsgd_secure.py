"""Dopamine's DP-FedSGD: learns, charges the server view, records the hospital view,
spreads σ over K silos as Lemma 1 says, and stops before passing the budget."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.federation.algorithms import FedSGDSecure
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.secure import IdealSecureSum
from dpfl.secure.he import HomomorphicError, HomomorphicSum
from dpfl.secure.masking import PairwiseMasking, SecureAggregationError

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


def _run(
    silos: list[Silo], summing: SecureSum, sigma: float = 1.0, **kwargs: int
) -> SimulationResult:
    algorithm = dataclasses.replace(_dopamine(sigma), **kwargs)
    return simulate(
        algorithm, silos, rounds=4, epsilon_budget=50.0, secure_sum=summing, progress=False
    )


def _max_gap(a: SimulationResult, b: SimulationResult) -> float:
    return max(float((a.params[n] - b.params[n]).abs().max()) for n in a.params)


@pytest.mark.parametrize("summing", [PairwiseMasking(), HomomorphicSum()], ids=["masking", "he"])
def test_masked_or_encrypted_sums_train_the_model_of_the_ideal_sum(
    breast_cancer_silos: Silos, summing: SecureSum
) -> None:
    """Same batches and noise: the models differ only by the fixed-point rounding of each
    round's sum (≤ K/(2·scale) a value, scaled by 1/K), and the charges are the same."""
    silos = breast_cancer_silos(3)
    ideal = _run(silos, IdealSecureSum())
    secure = _run(silos, summing)
    assert 0 < _max_gap(ideal, secure) < 4 * 2.0**-16
    assert secure.final_metrics()["accuracy"] == ideal.final_metrics()["accuracy"]
    for name, spent in ideal.epsilon[0].items():
        assert secure.epsilon[0][name].epsilon == spent.epsilon


@pytest.mark.parametrize("late", [{"h1"}, {"h1", "h3"}])
def test_hospitals_that_drop_after_masking_are_in_the_sum_at_full_noise(
    breast_cancer_silos: Silos, independent_epsilon: Callable[..., float], late: set[str]
) -> None:
    silos = breast_cancer_silos(5)
    assert late <= {s.name for s in silos}
    ideal = _run(silos, IdealSecureSum())
    dropped = _run(silos, PairwiseMasking(late_dropouts=late))
    assert _max_gap(ideal, dropped) < 4 * 2.0**-16
    for silo in silos:  # every reply is in every sum: the full σ, as without dropouts
        want = independent_epsilon(1.0, 16 / silo.size, 4)
        assert dropped.epsilon[0][silo.name].epsilon == pytest.approx(want, rel=1e-9)


def test_tolerated_dropouts_are_charged_before_the_smaller_sum_is_revealed(
    breast_cancer_silos: Silos, independent_epsilon: Callable[..., float]
) -> None:
    """d = 2 of K = 5: every hospital pays for a sum of 3 shares, σ√(3/5), whether or not
    anyone drops; the sum of the survivors is averaged over the survivors."""
    silos = breast_cancer_silos(5)
    lost = {"h0", "h4"}
    masked = _run(silos, PairwiseMasking(dropouts=lost), 3.0, tolerated_dropouts=2)
    ideal = _run(silos, IdealSecureSum(dropouts=lost), 3.0, tolerated_dropouts=2)
    everyone = _run(silos, IdealSecureSum(), 3.0, tolerated_dropouts=2)
    assert _max_gap(masked, ideal) < 4 * 2.0**-16
    assert _max_gap(everyone, ideal) > 1e-3  # the lost replies are not in the mean
    for silo in silos:
        q = 16 / silo.size
        server = independent_epsilon(3.0 * math.sqrt(3 / 5), q, 4)
        for run in (masked, ideal, everyone):
            assert run.epsilon[0][silo.name].epsilon == pytest.approx(server, rel=1e-9)
            hospitals = run.views[0][silo.name]["hospitals"].epsilon
            assert hospitals == pytest.approx(independent_epsilon(3.0 * math.sqrt(2 / 5), q, 4))


@pytest.mark.parametrize(
    ("summing", "error"),
    [
        (PairwiseMasking(dropouts={"h0", "h1", "h2"}), SecureAggregationError),
        (HomomorphicSum(dropouts={"h0", "h1", "h2"}), HomomorphicError),
        (IdealSecureSum(dropouts={"h0", "h1", "h2"}), ValueError),
    ],
    ids=["masking", "he", "ideal"],
)
def test_more_dropouts_than_tolerated_reveal_nothing(
    breast_cancer_silos: Silos, summing: SecureSum, error: type[Exception]
) -> None:
    silos = breast_cancer_silos(5)
    with pytest.raises(error, match="fewer than the 3"):
        _run(silos, summing, tolerated_dropouts=2)


def test_a_tolerance_that_allows_an_empty_sum_is_refused(breast_cancer_silos: Silos) -> None:
    with pytest.raises(ValueError, match="tolerating 3 dropouts of 3 hospitals"):
        _run(breast_cancer_silos(3), IdealSecureSum(), tolerated_dropouts=3)
    with pytest.raises(ValueError, match="tolerated_dropouts must be ≥ 0"):
        dataclasses.replace(_dopamine(1.0), tolerated_dropouts=-1)
