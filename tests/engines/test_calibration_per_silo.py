"""Per-silo calibration: each silo gets the least σ for its own (ε_k, δ_k), so none ends
far below its budget (with common calibration every silo gets the tightest silo's σ)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dpfl.engines import accounts
from dpfl.engines.accounts import Calibration
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import FedAvg, FedSGDSecure
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.privacy import Accountant, calibrate_noise
from dpfl.privacy.ledger import Ledger

CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)
BUDGETS = {"h0": (0.5, 1e-5), "h1": (2.0, 1e-5), "h2": (4.0, 1e-4)}


def _fedavg() -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, local_epochs=0.5)


def test_each_silo_spends_its_own_budget(
    breast_cancer_silos: Callable[[int], list[Silo]], tmp_path: Path
) -> None:
    silos = breast_cancer_silos(3)
    common, own = (  # RDP ledgers: calibration is what is tested, by any accountant
        simulate(
            _fedavg(),
            silos,
            RunPlan(rounds=3, budgets=BUDGETS, calibrate=mode, progress=False),
            ledger=Ledger(tmp_path / f"{mode}.sqlite", accountant="rdp"),
        )
        for mode in ("common", "per-silo")
    )
    sigmas = own.metadata["noise_multipliers"]
    assert sigmas["h0"] > sigmas["h1"] > sigmas["h2"]  # looser budget, less noise
    assert set(common.metadata["noise_multipliers"].values()) == {sigmas["h0"]}
    assert own.noise_multiplier == sigmas["h0"]
    for name, (eps, _) in BUDGETS.items():
        spent = own.epsilon[0][name].epsilon
        assert 0.97 * eps <= spent <= eps  # each silo close to, never above, its budget
        assert common.epsilon[0][name].epsilon <= spent
    assert common.epsilon[0]["h2"].epsilon < 0.5 * BUDGETS["h2"][0]  # what per-silo fixes


def test_per_silo_noise_is_refused_where_the_noise_is_shared(
    breast_cancer_silos: Callable[[int], list[Silo]], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    dopamine = FedSGDSecure(model=logistic_regression(30), loss=bce, dpsgd=CONFIG)
    # an RDP ledger: the refusal comes after calibration, which PLD makes ~3x slower
    with (
        Ledger(tmp_path / "ledger.sqlite", accountant="rdp") as ledger,
        pytest.raises(ValueError, match="cannot have noise multipliers of their own"),
    ):
        simulate(
            dopamine,
            breast_cancer_silos(3),
            RunPlan(rounds=2, budgets=BUDGETS, calibrate="per-silo", progress=False),
            ledger=ledger,
        )
    with pytest.raises(ValueError, match="'common' or 'per-silo'"):
        simulate(
            _fedavg(),
            breast_cancer_silos(3),
            RunPlan(rounds=1, budgets=BUDGETS, calibrate="x", progress=False),
        )


def test_common_sigma_is_the_largest_silo_sigma_with_fewer_searches(
    breast_cancer_silos: Callable[[int], list[Silo]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common σ is the per-silo σs' largest; a silo whose plan fits at the largest σ
    found so far gets one ε instead of a search (Kerkouche's 314 hospitals)."""
    infos = [s.info for s in breast_cancer_silos(3)]
    algorithm = _fedavg()
    rounds = {s.name: 3 for s in infos}
    plan = (rounds, BUDGETS, Accountant.RDP, {})
    largest = max(Calibration(algorithm, infos, *plan).per_silo().values())
    searches = []
    monkeypatch.setattr(
        accounts, "calibrate_noise", lambda *a, **k: searches.append(a) or calibrate_noise(*a, **k)
    )
    assert Calibration(algorithm, infos, *plan).common() == largest
    assert len(searches) == 1  # h0, the tightest, first: h1 and h2 fit at its σ
    searches.clear()
    assert Calibration(algorithm, infos[::-1], *plan).common() == largest
    assert len(searches) == 3  # each silo tighter than the ones before it
