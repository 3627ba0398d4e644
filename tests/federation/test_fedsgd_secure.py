"""Dopamine's DP-FedSGD: learns, charges the server view, records the hospital view,
spreads σ over the roster's K silos as Lemma 1 says (never over a cohort the server
makes up), releases nothing but each round's sum (momentum is the server's, on those
sums) and stops before passing the budget."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import Tensor

from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import StudyConfig
from dpfl.experiments.study.datasets import build_silos
from dpfl.federation.algorithms import FedSGDSecure, HospitalContext, Member
from dpfl.federation.algorithms.base import Instruction
from dpfl.federation.messages import SecureSum, Summed
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.dpsgd import DPSGDConfig, parameters_of
from dpfl.local.losses import bce
from dpfl.local.noise import NoiseSource, SeededNoise
from dpfl.models import logistic_regression
from dpfl.privacy import events
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
    result = simulate(_dopamine(1.0), silos, RunPlan(rounds=30, epsilon=50.0, progress=False))
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
    result = simulate(_dopamine(2.0), silos, RunPlan(rounds=10_000, epsilon=1.0, progress=False))
    assert result.stopped_by_budget
    done = result.rounds_completed
    assert 0 < done < 10_000
    worst = min(silos, key=lambda s: s.size)  # largest q: the first to run out
    assert result.epsilon[0][worst.name].epsilon <= 1.0
    assert independent_epsilon(2.0, 16 / worst.size, done + 1) > 1.0
    with pytest.raises(ValueError, match="no further round fits"):
        simulate(_dopamine(1.0), silos, RunPlan(rounds=5, epsilon=1.0, progress=False))


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
        RunPlan(rounds=1, trials=trials, seed=3, epsilon=100.0, progress=False),
    )
    quiet = simulate(
        _dopamine(0.0, 0.0), silos, RunPlan(rounds=1, trials=trials, seed=3, progress=False)
    )
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
        algorithm, silos, RunPlan(rounds=4, epsilon=50.0, secure_sum=summing, progress=False)
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


class _Impulse(NoiseSource):
    """Noise that is `std` in every value when hot, else none."""

    def __init__(self, hot: bool) -> None:
        self.hot = hot

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        return torch.full(shape, std if self.hot else 0.0, dtype=dtype)

    def metadata(self) -> dict[str, Any]:
        return {"noise": "impulse"}


def _no_gradient(logits: Tensor, target: Tensor) -> Tensor:
    return logits.sum(1) * 0.0


@dataclasses.dataclass
class _Revealed:
    """An ideal secure sum without the `absent` hospitals' replies that keeps what it
    reveals."""

    absent: set[str]
    revealed: list[Tensor]
    reveals_inputs: ClassVar[bool] = False

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        summed = IdealSecureSum(dropouts=self.absent)(vectors, at_least=at_least)
        self.revealed.append(summed.total)
        return summed


ABSENT = [set(), {"h1"}, {"h2"}, set(), {"h1"}, {"h3"}]
"""Whose replies each round's sum lacks (d = 1 of K = 4): h1 drops, rejoins, drops."""


def _released(algorithm: FedSGDSecure, hot: tuple[str, int]) -> Tensor:
    """Every round's released sum (its first value) from a zero model with zero gradients
    when the one non-zero noise draw is (hospital, round) `hot`'s: that draw's
    coefficient in each released sum, every released value being linear in the draws."""
    silos = [
        Silo.from_arrays(f"h{k}", np.zeros((20, 2)), np.arange(20) % 2, public_size=20)
        for k in range(4)
    ]
    infos = [s.info for s in silos]
    zero = {k: torch.zeros_like(v) for k, v in parameters_of(algorithm.model).items()}
    state = algorithm.initial_state(infos, zero)
    local = {s.name: algorithm.initial_local_state(zero) for s in silos}
    revealed: list[Tensor] = []
    for round_, absent in enumerate(ABSENT):
        orders = algorithm.configure(state, round_, infos, lambda: np.random.default_rng(0))
        members = [
            Member(
                orders[s.name],
                s,
                local[s.name],
                HospitalContext(
                    round_,
                    lambda: np.random.default_rng(0),
                    lambda s=s, r=round_: _Impulse((s.name, r) == hot),
                    lambda charges: None,
                ),
            )
            for s in silos
        ]
        replies = {}
        for m, (reply, after) in zip(members, algorithm.client_updates(members), strict=True):
            local[m.silo.name] = after
            assert reply is not None
            replies[m.silo.name] = reply
        state = algorithm.aggregate(state, replies, _Revealed(absent, revealed))
    return torch.stack([total[0] for total in revealed])


def test_hospitals_that_drop_and_rejoin_release_nothing_but_each_rounds_sum() -> None:
    """K = 4, d = 1, momentum 0.9. Each released sum must be a function of the earlier
    released sums and its own round's: a round's draws that are in its sum enter every
    later sum with one coefficient (only their sum is ever used), and a draw whose reply
    was not in its round's sum enters none. A velocity kept at each hospital breaks both:
    a later sum over other hospitals holds their earlier shares without the absent one's
    (their difference exposes it), and a hospital that rejoins brings back the share of
    its reply that was left out."""
    config = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5, momentum=0.9)
    algorithm = FedSGDSecure(
        model=logistic_regression(2), loss=_no_gradient, dpsgd=config, tolerated_dropouts=1
    )
    names = ["h0", "h1", "h2", "h3"]
    for s, absent in enumerate(ABSENT):
        response = {k: _released(algorithm, (k, s)) for k in names}
        inside = [response[k] for k in names if k not in absent]
        assert inside[0][s] != 0  # the draw is in its own round's sum
        for other in inside[1:]:
            torch.testing.assert_close(other, inside[0], rtol=1e-6, atol=0)
        for k in absent:
            assert not response[k].any(), (k, s, response[k])


@pytest.mark.parametrize(
    "cohort",
    [("h0", "h1", "h2", "ghost"), ("h0", "h1", "h1", "h2"), ("h0", "h1")],
    ids=["padded", "repeated", "short"],
)
def test_a_cohort_other_than_the_roster_is_refused_before_anything_is_drawn_or_charged(
    breast_cancer_silos: Silos, cohort: tuple[str, ...]
) -> None:
    """A server that padded the cohort would get a reply with σ/√4 of noise where σ/√3
    was charged: the hospital's K is its roster's, and the cohort must be exactly it."""
    silos = breast_cancer_silos(3)
    algorithm = dataclasses.replace(_dopamine(1.0), roster=("h0", "h1", "h2"))
    infos = {s.name: s.info for s in silos}
    used: list[str] = []
    charged: list[tuple[Any, str | None, events.PrivacyEvent]] = []

    def noise() -> NoiseSource:
        used.append("noise")
        return SeededNoise(0)

    def rng() -> np.random.Generator:
        used.append("rng")
        return np.random.default_rng(0)

    ctx = HospitalContext(0, rng, noise, charged.extend)
    start = parameters_of(algorithm.model)
    sent = tuple(infos.get(name, SiloInfo(name, 1000)) for name in cohort)
    with pytest.raises(ValueError, match="must be exactly fedsgd_secure's roster of 3"):
        algorithm.client_update(Instruction(start, sent), silos[0], {}, ctx)
    assert used == [] and charged == []
    roster = tuple(reversed(infos.values()))  # the roster in any order is served
    reply, _ = algorithm.client_update(Instruction(start, roster), silos[0], {}, ctx)
    assert reply is not None
    q = 16 / silos[0].size
    want = [events.poisson_gaussian(q, 1.0), events.poisson_gaussian(q, math.sqrt(2 / 3))]
    assert [event for _, _, event in charged] == want


def test_a_run_over_other_silos_than_the_roster_is_refused(breast_cancer_silos: Silos) -> None:
    algorithm = dataclasses.replace(_dopamine(1.0), roster=("h0", "h1", "h2", "h3"))
    with pytest.raises(ValueError, match=r"the run's silos .* roster of 4 hospitals"):
        simulate(algorithm, breast_cancer_silos(3), RunPlan(rounds=1, epsilon=9.0, progress=False))
    with pytest.raises(ValueError, match="names a hospital twice"):
        dataclasses.replace(_dopamine(1.0), roster=("h0", "h0"))


def test_a_study_builds_dopamine_over_its_silos() -> None:
    """What a deployment builds at each hospital (`Deployment.build`) from its roster."""
    config = StudyConfig.model_validate(
        {
            "name": "roster",
            "rounds": 2,
            "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
            "algorithm": {"name": "fedsgd_secure"},
            "privacy": {"epsilon": 4.0, "noise_multiplier": 1.0, "delta": 1e-5},
        }
    )
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)
    assert isinstance(algorithm, FedSGDSecure)
    assert algorithm.roster == tuple(s.name for s in silos)


def test_a_step_of_adam_at_each_hospital_is_refused() -> None:
    adam = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.1, optimizer="adam")
    with pytest.raises(ValueError, match="one plain noisy step"):
        FedSGDSecure(model=logistic_regression(2), loss=bce, dpsgd=adam)
