"""Several simulated studies over one hospital ledger with a cap on a hospital's records:
a study whose plan would take the composition over all of them past the cap is refused
before round 0, naming the studies that spent it, and records nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_breast_cancer

from dpfl.engines.accounts import UnaffordablePlan
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import FedAvg
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger

_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)


def _silos() -> list[Silo]:
    return [
        Silo.from_arrays(
            f"h{k}", _X[100 * k : 100 * k + 60], _Y[100 * k : 100 * k + 60], public_size=60
        )
        for k in range(2)
    ]


def _study(ledger: Ledger) -> None:
    torch.manual_seed(0)
    config = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)
    fedavg = FedAvg(model=logistic_regression(30), loss=bce, dpsgd=config, expected_batch_size=10)
    simulate(fedavg, _silos(), RunPlan(rounds=2, progress=False), ledger=ledger)


def test_a_second_simulated_study_past_the_cap_is_refused_before_round_0(
    tmp_path: Path,
) -> None:
    alone = tmp_path / "alone.sqlite"
    with Ledger(alone) as book:
        _study(book)
        one = book.spent("h0/trial-0").epsilon  # what a study spends of h0
    path = tmp_path / "hospital.sqlite"
    with Ledger(path) as steward:
        steward.cap_dataset("h0", epsilon=one * 1.1, delta=1e-5)  # room for one study
    with Ledger(path, study="study-1") as first:
        _study(first)
        assert first.budget("h0/trial-0").dataset == "h0"
        assert first.budget("h1/trial-0").dataset is None  # h1's records are not capped
    with Ledger(path, study="study-2") as second:
        with pytest.raises(UnaffordablePlan, match=r"dataset 'h0'.*by study-1 \(ε="):
            _study(second)
        assert second.entries("h0/trial-0") == []
    with Ledger(path, create=False) as reader:
        (h0,) = reader.datasets()
        assert h0.spent.epsilon == pytest.approx(one) and list(h0.studies) == ["study-1"]
