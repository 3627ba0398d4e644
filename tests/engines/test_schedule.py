"""Client sampling planned on the drawn schedule: each silo's plan is the rounds its
cohorts take it to (drawn from the seed before round 0), so calibration spends the
budget instead of planning every silo into every round, and what is charged is what was
planned."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from dpfl.data import partition
from dpfl.engines.plan import RunPlan, drawn_schedule, participations
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import FedAvg, Instruction, State
from dpfl.federation.algorithms.base import broadcast
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger
from dpfl.privacy.accounts import account

_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)  # a test fixture: its own moments are fine
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)
ROUNDS, TRIALS, RATE = 12, 2, 0.3


def _silos() -> list[Silo]:
    return [
        Silo.from_arrays(
            f"h{k}", _X[idx], _Y[idx], _X[idx[:20]], _Y[idx[:20]], public_size=len(idx)
        )
        for k, idx in enumerate(partition.iid_stratified(_Y, 3, seed=0))
    ]


def _fedavg() -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(
        model=logistic_regression(30),
        loss=bce,
        dpsgd=CONFIG,
        expected_batch_size=16,
        client_rate=RATE,
    )


def test_the_drawn_schedule_is_what_the_run_charges(tmp_path: Path) -> None:
    silos = _silos()
    schedule = drawn_schedule(_fedavg(), [s.info for s in silos], TRIALS, 3, ROUNDS)
    planned = participations(schedule, 0, ROUNDS)
    assert 0 < min(planned.values()) < max(planned.values()) < ROUNDS  # sampling happened
    simulate(
        _fedavg(),
        silos,
        RunPlan(rounds=ROUNDS, trials=TRIALS, seed=3, progress=False),
        ledger=tmp_path / "l",
    )
    charged: Counter[tuple[str, int]] = Counter()
    with Ledger(tmp_path / "l", create=False) as book:
        for silo in silos:
            for trial in range(TRIALS):
                rounds = {e.round for e in book.entries(account(silo, trial))}
                charged[silo.name, trial] = len(rounds)
    assert charged == planned


def test_calibration_spends_the_budget_of_the_busiest_silo(tmp_path: Path) -> None:
    """Planning every silo into all 12 rounds left them at a fraction of ε; planned on
    the schedule, the silo with the most rounds ends at the budget, none above it (RDP:
    PLD's calibration takes seconds a silo)."""
    result = simulate(
        _fedavg(),
        _silos(),
        RunPlan(
            rounds=ROUNDS, trials=TRIALS, seed=3, epsilon=2.0, calibrate="common", progress=False
        ),
        ledger=Ledger(tmp_path / "l", accountant="rdp"),
    )
    spent = [r.epsilon for trial in result.epsilon for r in trial.values()]
    assert max(spent) <= 2.0
    assert max(spent) > 0.98 * 2.0


def test_per_silo_calibration_gives_rarer_silos_less_noise(tmp_path: Path) -> None:
    result = simulate(
        _fedavg(),
        _silos(),
        RunPlan(rounds=ROUNDS, trials=1, seed=3, epsilon=2.0, calibrate="per-silo", progress=False),
        ledger=Ledger(tmp_path / "l", accountant="rdp"),
    )
    schedule = drawn_schedule(_fedavg(), [s.info for s in _silos()], 1, 3, ROUNDS)
    rounds = participations(schedule, 0, ROUNDS)
    sigmas = result.metadata["noise_multipliers"]
    by_rounds = sorted(sigmas, key=lambda name: rounds[name, 0])
    assert rounds[by_rounds[0], 0] < rounds[by_rounds[-1], 0]
    assert sigmas[by_rounds[0]] < sigmas[by_rounds[-1]]
    assert all(r.epsilon <= 2.0 for r in result.epsilon[0].values())


@dataclass(frozen=True)
class _Everyone(FedAvg):
    """Samples a cohort for the plan but instructs every silo: not what was planned."""

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        return broadcast(state, silos)


def test_a_cohort_outside_the_schedule_stops_the_run(tmp_path: Path) -> None:
    everyone = _Everyone(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, client_rate=RATE)
    with pytest.raises(RuntimeError, match="outside the schedule"):
        simulate(
            everyone, _silos(), RunPlan(rounds=3, seed=3, progress=False), ledger=tmp_path / "l"
        )
