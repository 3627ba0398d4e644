"""Server optimisers: Flower's strategies of the same names, step for step; post-processing
only (the hospitals' half and every event unchanged); refused where nothing is averaged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import strategy as flower
from pydantic import TypeAdapter, ValidationError

from dpfl.federation.algorithms import (
    SETTINGS,
    Averaging,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedYogi,
    ServerOptimizer,
)
from dpfl.federation.algorithms.base import SERVER_OPTIMIZER, Reply, flat
from dpfl.federation.server_optimizers import ServerOptimizerSettings
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.secure import InTheClear

ROUNDS = 6


def aggregates(size: int = 40) -> tuple[np.ndarray, list[np.ndarray]]:
    """A start and the aggregates of ROUNDS rounds, each near the model before it."""
    rng = np.random.default_rng(5)
    start = rng.normal(size=size)
    return start, [start + rng.normal(scale=0.3, size=size) * (r + 1) for r in range(ROUNDS)]


def ours(optimizer: ServerOptimizer, start: np.ndarray, means: Sequence[np.ndarray]) -> list:
    """The models after each round where each round's aggregate is its step from the model
    it was sent: Δ = (mean − start) applied to the current model, as Flower sees it."""
    x, memory, out = torch.tensor(start), {}, []
    for mean in means:
        aggregate = x + torch.tensor(mean - start)
        x, memory = optimizer.moved(x, aggregate, memory)
        out.append(x.numpy().copy())
    return out


def flowers(strategy: Any, start: np.ndarray, means: Sequence[np.ndarray], first: int) -> list:
    """The same with Flower's strategy, each round one client whose model is the current
    one moved by (mean − start); rounds numbered from `first`."""
    current, out = start, []
    for r, mean in enumerate(means):
        model = ndarrays_to_parameters([current + (mean - start)])
        fit = FitRes(Status(Code.OK, ""), model, num_examples=1, metrics={})
        parameters, _ = strategy.aggregate_fit(first + r, [(None, fit)], [])
        (current,) = parameters_to_ndarrays(parameters)
        out.append(current)
    return out


@pytest.mark.parametrize(
    ("optimizer", "strategy", "first"),
    [
        (
            FedAvgM(0.7, 0.9),
            lambda p: flower.FedAvgM(
                initial_parameters=p, server_learning_rate=0.7, server_momentum=0.9
            ),
            1,
        ),
        (
            FedAdagrad(0.1, 0.0, 0.99, 1e-3),  # Flower's FedAdagrad keeps no first moment
            lambda p: flower.FedAdagrad(initial_parameters=p, eta=0.1, tau=1e-3),
            1,
        ),
        (
            FedYogi(0.1, 0.9, 0.99, 1e-3),
            lambda p: flower.FedYogi(
                initial_parameters=p, eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3
            ),
            1,
        ),
        # Flower's FedAdam corrects its bias at round r by β^(r+1): its round 0 is our step 1
        (
            FedAdam(0.1, 0.9, 0.99, 1e-3),
            lambda p: flower.FedAdam(
                initial_parameters=p, eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3
            ),
            0,
        ),
    ],
    ids=["fedavgm", "fedadagrad", "fedyogi", "fedadam"],
)
def test_each_optimiser_moves_the_model_as_flowers_strategy_of_its_name(
    optimizer: ServerOptimizer, strategy: Any, first: int
) -> None:
    start, means = aggregates()
    theirs = flowers(strategy(ndarrays_to_parameters([start])), start, means, first)
    mine = ours(optimizer, start, means)
    for r, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"round {r}")
    assert not np.allclose(mine[-1], start + (means[-1] - start))  # not plain averaging


def test_averaging_is_the_aggregate_to_the_bit_and_keeps_no_memory() -> None:
    old, aggregate = torch.randn(30), torch.randn(30)
    moved, memory = Averaging().moved(old, aggregate, {})
    assert moved is aggregate and memory == {}


def test_fedavgm_without_momentum_at_rate_one_is_averaging() -> None:
    old, aggregate = torch.randn(30), torch.randn(30)
    memory: dict[str, Any] = {}
    for _ in range(3):
        moved, memory = FedAvgM(1.0, 0.0).moved(old, aggregate, memory)
        torch.testing.assert_close(moved, aggregate, rtol=0, atol=1e-6)


def test_adaptive_steps_are_bounded_by_the_rate_over_tau_and_keep_the_dtype() -> None:
    """|ηm/(√v + τ)| ≤ η·|m|/√v: with β₁ = 0 each coordinate moves by at most η (Adagrad's
    first step, v = Δ²), whatever the size of Δ."""
    delta = torch.tensor([1e-6, -3.0, 250.0], dtype=torch.float32)
    move, memory = FedAdagrad(0.5, 0.0, 0.99, 1e-9).step(delta, {})
    assert move.dtype == torch.float32 and memory["steps"] == 1
    assert torch.all(move.abs() <= 0.5 + 1e-6) and torch.equal(move.sign(), delta.sign())


def test_a_study_names_an_optimiser_or_gives_its_table_and_bad_ones_are_refused() -> None:
    read = TypeAdapter(ServerOptimizerSettings).validate_python
    assert read("fedyogi").build() == FedYogi()
    assert read({"optimizer": "fedavgm", "momentum": 0.5}).build() == FedAvgM(1.0, 0.5)
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        read("adam")
    with pytest.raises(ValidationError, match=r"fedavgm\.beta1"):
        read({"optimizer": "fedavgm", "beta1": 0.5})  # another optimiser's key
    with pytest.raises(ValidationError, match=r"fedadam\.tau"):
        read({"optimizer": "fedadam", "tau": 0.0})
    with pytest.raises(ValidationError, match=r"fedavgm\.momentum"):
        read({"optimizer": "fedavgm", "momentum": 1.0})


@pytest.mark.parametrize("name", ["cyclic", "local", "centralized", "aop"])
def test_algorithms_that_average_nothing_refuse_a_server_optimiser(name: str) -> None:
    with pytest.raises(ValidationError, match=f"algorithm.server 'fedadam' is not for {name}"):
        SETTINGS[name].model_validate({"name": name, "server": "fedadam"})


def test_dopamines_own_server_momentum_is_not_stacked_with_another() -> None:
    settings = SETTINGS["fedsgd_secure"]
    with pytest.raises(ValidationError, match="momentum is already the server's"):
        settings.model_validate({"name": "fedsgd_secure", "momentum": 0.9, "server": "fedavgm"})
    assert settings.model_validate({"name": "fedsgd_secure", "server": "fedadam"})


def test_next_state_keeps_the_memory_in_the_state_and_a_round_without_replies_stays() -> None:
    fedavg = FedAvg(
        torch.nn.Linear(3, 1), bce, DPSGDConfig.non_private(0.1), server_optimizer=FedAdam()
    )
    state = fedavg.initial_state([])
    update = Reply(torch.full_like(flat(state["global"]), 0.25))
    moved = fedavg.next_state(state, {"a": update, "b": update}, InTheClear())
    assert moved[SERVER_OPTIMIZER]["steps"] == 1 and SERVER_OPTIMIZER not in state
    # Adam's first step on Δ = 0.5: m = 0.05, √v = 0.05, η·√(1 − β₂)/(1 − β₁) = 0.1
    step = flat(moved["global"]) - flat(state["global"])
    torch.testing.assert_close(step, torch.full_like(step, 0.1 * 0.05 / 0.051), rtol=1e-5, atol=0)
    same = fedavg.next_state(moved, {}, InTheClear())
    assert torch.equal(flat(same["global"]), flat(moved["global"]))
    assert same[SERVER_OPTIMIZER]["steps"] == 1
