"""FL-SIGN(-DP), A*STAR's federated output perturbation and the pooled references C/CDP:
they learn, their ledger ε is what ran, FL-SIGN's upstream is 1 bit a parameter, and
runs repeat bit for bit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from torch import Tensor

from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import Algorithm, FedAvg
from dpfl.federation.algorithms.aop import AOP
from dpfl.federation.algorithms.base import flat
from dpfl.federation.algorithms.centralized import Centralized
from dpfl.federation.algorithms.sign import Sign, random_signs
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.local.output_perturbation import AOPConfig
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger, PrivacyParameterError, events
from dpfl.privacy.accounts import account

Silos = Callable[[int], list[Silo]]
DP = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)
NON_PRIVATE = DPSGDConfig.non_private(learning_rate=0.5)
GAMMA = 0.05
AOP_EPSILON, AOP_DELTA, AOP_EPOCHS = 2.0, 1e-6, 2


def _sign(dpsgd: DPSGDConfig = DP, **kwargs: object) -> Sign:
    torch.manual_seed(0)
    return Sign(
        model=logistic_regression(30),
        loss=bce,
        dpsgd=dpsgd,
        server_learning_rate=GAMMA,
        **kwargs,  # type: ignore[arg-type]
    )


def _centralized(silos: list[Silo], dpsgd: DPSGDConfig = DP) -> Centralized:
    torch.manual_seed(0)
    return Centralized(model=logistic_regression(30), loss=bce, dpsgd=dpsgd)


def _aop() -> AOP:
    torch.manual_seed(0)
    return AOP(
        model=logistic_regression(30),
        loss=bce,
        config=AOPConfig(
            AOP_EPSILON,
            AOP_DELTA,
            regularization=100.0,
            gradient_tolerance=1e-4,
            feature_norm_bound=1.0,
        ),
        epochs=AOP_EPOCHS,
    )


LEARNERS: dict[str, tuple[Callable[[list[Silo]], Algorithm], int]] = {
    "fl-sign": (lambda _: _sign(NON_PRIVATE), 10),
    "fl-sign-dp": (lambda _: _sign(), 10),
    "c": (lambda silos: _centralized(silos, NON_PRIVATE), 3),
    "cdp": (_centralized, 3),
    "aop": (lambda _: _aop(), AOP_EPOCHS),
}


@pytest.mark.parametrize("name", list(LEARNERS))
def test_each_algorithm_learns_on_breast_cancer_over_three_silos(
    name: str, breast_cancer_silos: Silos
) -> None:
    make, rounds = LEARNERS[name]
    silos = breast_cancer_silos(3)
    algorithm = make(silos)
    result = simulate(algorithm, silos, RunPlan(rounds=rounds, progress=False))
    # The fixture's test rows are the last fifth of each silo's rows, 76% benign: beat
    # that majority class by making at most half its errors.
    labels = torch.cat([s.y_test for s in silos if s.y_test is not None]).double()
    majority = max(labels.mean().item(), 1 - labels.mean().item())
    assert 1 - result.final_metrics()["accuracy"] < (1 - majority) / 2
    assert result.final_metrics()["auroc"] > 0.95
    assert set(result.silo_metrics[0]) == {"h0", "h1", "h2"}
    assert (result.epsilon != [{}]) == algorithm.private


def test_the_sign_server_moves_every_coordinate_by_exactly_gamma(
    breast_cancer_silos: Silos,
) -> None:
    algorithm = _sign()
    start = {name: v.unsqueeze(0) for name, v in algorithm.initial_state([])["global"].items()}
    result = simulate(algorithm, breast_cancer_silos(3), RunPlan(rounds=1, progress=False))
    for name, value in result.params.items():
        # Three votes of ±1 never tie, so every coordinate moves by +γ or −γ.
        assert torch.allclose((value - start[name]).abs(), torch.full_like(value, GAMMA))


def test_random_signs_for_exact_zeros_are_fair_coins() -> None:
    update = torch.zeros(20_000)
    update[:100] = torch.linspace(-1.0, 1.0, 100).clamp(min=1e-3)  # positive, kept
    update[100:200] = -1e-30  # tiny but not zero: its sign is kept
    signs = random_signs(update, np.random.default_rng(7))
    assert bool(((signs == 1) | (signs == -1)).all())
    assert bool((signs[:100] == 1).all()) and bool((signs[100:200] == -1).all())
    coins = signs[200:]
    heads = int((coins == 1).sum())
    assert binomtest(heads, len(coins), 0.5).pvalue > 0.01
    # Consecutive coins are independent too: pairs (+,+), (+,−), (−,+), (−,−) equally often.
    pairs = ((coins[:-1] > 0).long() * 2 + (coins[1:] > 0).long()).bincount(minlength=4)
    expected = (len(coins) - 1) / 4
    chi2 = float(((pairs - expected) ** 2 / expected).sum())
    assert chi2 < 11.34  # the 99% quantile of χ² with 3 degrees of freedom


def _without_feature(silos: list[Silo], column: int) -> list[Silo]:
    """The silos with one feature absent (0) from every training record, as a rare code."""
    bare = []
    for s in silos:
        x = s.x.clone()
        x[:, column] = 0.0
        bare.append(dataclasses.replace(s, x=x))
    return bare


def test_ternary_votes_leave_the_weights_no_record_touches_where_coins_move_them(
    breast_cancer_silos: Silos,
) -> None:
    silos = _without_feature(breast_cancer_silos(3), column=4)
    weight = 4  # logistic regression: the weights, then the bias

    def moved(votes: str, rounds: int) -> Tensor:
        algorithm = _sign(NON_PRIVATE, votes=votes)
        start = flat(algorithm.initial_state([])["global"])
        result = simulate(algorithm, silos, RunPlan(rounds=rounds, progress=False))
        return (flat({k: v[0] for k, v in result.params.items()}) - start).abs()

    first = moved("ternary", rounds=1)
    # three nonzero votes never tie: every touched coordinate moves by exactly γ
    assert torch.allclose(first[torch.arange(31) != weight], torch.tensor(GAMMA))
    assert first[weight] == 0.0
    assert moved("ternary", rounds=8)[weight] == 0.0
    assert moved("binary", rounds=8)[weight] > 0.0  # three coins a round: a random walk


def test_ternary_votes_under_dp_are_the_binary_votes(breast_cancer_silos: Silos) -> None:
    silos = _without_feature(breast_cancer_silos(3), column=4)
    binary, ternary = (
        simulate(_sign(votes=votes), silos, RunPlan(rounds=3, seed=5, progress=False))
        for votes in ("binary", "ternary")
    )
    # the noise leaves no coordinate exactly 0: the same votes, the same model
    for name, value in binary.params.items():
        assert torch.equal(value, ternary.params[name])
    for traffic in ternary.traffic.values():
        assert traffic["up"] == traffic["messages"] // 2 * 7  # ⌈31 votes / 5⌉ bytes


def test_sign_upstream_is_a_32nd_of_fedavg_on_the_same_run(breast_cancer_silos: Silos) -> None:
    silos = breast_cancer_silos(3)
    torch.manual_seed(0)
    fedavg = FedAvg(model=logistic_regression(30), loss=bce, dpsgd=DP, clients_per_round=2)
    runs = [
        simulate(algorithm, silos, RunPlan(rounds=6, seed=3, progress=False))
        for algorithm in (fedavg, _sign(clients_per_round=2))
    ]
    plain, sign = (run.traffic for run in runs)
    assert set(plain) == set(sign) == {account(s, 0) for s in silos}
    for name in plain:
        taken = plain[name]["messages"] // 2  # same seed: the same clients take part
        assert sign[name]["messages"] == 2 * taken and taken > 0
        assert sign[name]["down"] == plain[name]["down"] == taken * 4 * 31  # float32 model
        assert sign[name]["up"] == taken * 4  # ⌈31 bits / 8⌉ bytes
        # 1/32 of FedAvg's upstream, up to the rounding of each message's last byte
        assert plain[name]["up"] / 32 <= sign[name]["up"] < plain[name]["up"] / 32 + taken


def test_fl_sign_dp_charges_each_silo_its_own_steps_in_the_rounds_it_took_part_in(
    breast_cancer_silos: Silos, tmp_path: Path, independent_epsilon: Callable[..., float]
) -> None:
    silos = breast_cancer_silos(3)
    algorithm = _sign(clients_per_round=2)
    result = simulate(
        algorithm, silos, RunPlan(rounds=5, progress=False), ledger=tmp_path / "l.sqlite"
    )
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        entries = {s.name: ledger.entries(account(s, 0)) for s in silos}
    assert sum(len(e) for e in entries.values()) == 2 * 5
    for silo in silos:
        steps = round(1.0 / (16 / silo.size))  # one local epoch of expected batches of 16
        assert all(
            e.event == algorithm.participation_event(silo, silos) for e in entries[silo.name]
        )
        expected = independent_epsilon(1.0, 16 / silo.size, len(entries[silo.name]) * steps)
        assert result.epsilon[0][silo.name].epsilon == pytest.approx(expected, rel=1e-9)


def test_cdp_charges_every_silo_the_pooled_run(
    breast_cancer_silos: Silos, tmp_path: Path, independent_epsilon: Callable[..., float]
) -> None:
    silos = breast_cancer_silos(3)
    algorithm = _centralized(silos)
    pooled = sum(s.size for s in silos)
    pooled_rate, steps = 16 / pooled, round(pooled / 16)
    for silo in silos:  # the pool's q and steps, not the silo's
        assert algorithm.participation_event(silo, silos) == events.poisson_gaussian(
            pooled_rate, 1.0, steps=steps
        )
    result = simulate(
        algorithm, silos, RunPlan(rounds=2, progress=False), ledger=tmp_path / "l.sqlite"
    )
    expected = independent_epsilon(1.0, pooled_rate, 2 * steps)
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        for silo in silos:
            assert len(ledger.entries(account(silo, 0))) == 2
            assert result.epsilon[0][silo.name].epsilon == pytest.approx(expected, rel=1e-9)
    assert result.traffic == {}  # no model messages: the records were pooled instead
    fewer = silos[:2]  # the charge follows the pool actually formed
    fewer_pool = sum(s.size for s in fewer)
    assert algorithm.participation_event(fewer[0], fewer) == events.poisson_gaussian(
        16 / fewer_pool, 1.0, steps=round(fewer_pool / 16)
    )


def test_aop_spends_epsilon_over_t_per_epoch_by_basic_composition(
    breast_cancer_silos: Silos, tmp_path: Path
) -> None:
    silos = breast_cancer_silos(3)
    algorithm = _aop()
    release = events.approximate_dp(AOP_EPSILON / AOP_EPOCHS, AOP_DELTA / AOP_EPOCHS)
    assert algorithm.participation_event(silos[0], silos) == release
    result = simulate(
        algorithm, silos, RunPlan(rounds=AOP_EPOCHS, progress=False), ledger=tmp_path / "l.sqlite"
    )
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        for silo in silos:
            name = account(silo, 0)
            assert [e.event for e in ledger.entries(name)] == [release] * AOP_EPOCHS
            # T·(ε/T) = ε at δ = T·(δ/T) or above; below it basic composition cannot
            # answer, and the ledger refuses rather than report ε.
            assert result.epsilon[0][silo.name].epsilon == AOP_EPSILON
            assert ledger.spent(name, delta=AOP_DELTA).epsilon == AOP_EPSILON
            assert ledger.spent(name, delta=2 * AOP_DELTA).epsilon == AOP_EPSILON
            with pytest.raises(PrivacyParameterError, match="already use δ"):
                ledger.spent(name, delta=AOP_DELTA / 2)
    with pytest.raises(ValueError, match="T = 2 epochs"):
        simulate(_aop(), silos, RunPlan(rounds=AOP_EPOCHS + 1, progress=False))


@pytest.mark.parametrize("name", ["fl-sign-dp", "cdp", "aop"])
def test_same_seed_same_model_bit_for_bit(name: str, breast_cancer_silos: Silos) -> None:
    silos = breast_cancer_silos(3)
    make = LEARNERS[name][0]
    first, again, other = (
        simulate(make(silos), silos, RunPlan(rounds=2, trials=2, seed=seed, progress=False))
        for seed in (5, 5, 6)
    )
    # Whole models: FL-SIGN's coordinates live on the lattice w₀ + γℤ, so one coordinate
    # (the bias) may well agree across seeds.
    model, repeat, changed = (
        torch.cat([run.params[name].flatten(1) for name in sorted(run.params)], dim=1)
        for run in (first, again, other)
    )
    assert torch.equal(model, repeat)
    assert not torch.equal(model, changed)
    assert not torch.equal(model[0], model[1])  # trials differ
