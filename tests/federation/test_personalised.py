"""puffle's personalised algorithms (local, MR-MTL, Ditto, finetuning): they learn, each
silo's ledger ε is an independent composition of every step it ran (Ditto's two passes
included), MR-MTL spans local training (λ = 0, bit for bit) to consensus (large λ), and
runs repeat bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.federation.algorithms import DPSGDAlgorithm, FedAvg
from dpfl.federation.algorithms.ditto import Ditto
from dpfl.federation.algorithms.finetune import Finetune
from dpfl.federation.algorithms.local import Local
from dpfl.federation.algorithms.mrmtl import MRMTL
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger
from dpfl.privacy.accounts import account

Silos = Callable[[int], list[Silo]]
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)


def _make(kind: type[DPSGDAlgorithm], **kwargs: Any) -> Any:
    torch.manual_seed(0)
    kwargs.setdefault("dpsgd", CONFIG)
    return kind(model=logistic_regression(30), loss=bce, **kwargs)


ALGORITHMS = {
    "local": lambda: _make(Local),
    "mrmtl": lambda: _make(MRMTL, strength=0.5),
    "ditto": lambda: _make(Ditto, strength=0.5),
    "finetune": lambda: _make(Finetune, federated_rounds=1),
}


def _simulate(
    algorithm: FedAvg, silos: list[Silo], rounds: int, ledger: Path | None = None, **kwargs: Any
) -> Any:
    """A quiet run evaluated after its last round only."""
    plan = RunPlan(rounds=rounds, eval_every=rounds, progress=False, **kwargs)
    return simulate(algorithm, silos, plan, ledger=ledger)


def _run(algorithm: FedAvg, silos: list[Silo], **kwargs: Any) -> tuple[Any, Params]:
    """The result and the personal models stacked as [trials, silos, ...]."""
    result = _simulate(algorithm, silos, **kwargs)
    names = result.silo_models[silos[0].name]
    personal = {n: torch.stack([result.silo_models[s.name][n] for s in silos], 1) for n in names}
    return result, personal


def _spread(personal: Params, mean: Params) -> float:
    """Largest distance, over silos, of a silo's model from w̄ (trial 0)."""
    flat = torch.cat([personal[n][0].flatten(1) for n in personal], 1)
    centre = torch.cat([mean[n][0].flatten() for n in personal])
    return float((flat - centre).norm(dim=1).max())


@pytest.mark.parametrize("name", ALGORITHMS)
def test_learns_on_breast_cancer_over_three_silos(name: str, breast_cancer_silos: Silos) -> None:
    silos = breast_cancer_silos(3)
    result = _simulate(ALGORITHMS[name](), silos, 5)
    common = round(float(np.mean(np.concatenate([s.y.numpy() for s in silos]))))
    tested = np.concatenate([s.y_test.numpy() for s in silos if s.y_test is not None])
    majority = float(np.mean(tested == common))  # the majority class's test accuracy
    assert result.final_metrics()["accuracy"] > majority + 0.15
    assert result.final_metrics()["auroc"] > 0.95
    assert set(result.silo_metrics[0]) == {"h0", "h1", "h2"}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_ledger_epsilon_equals_an_independent_composition(
    name: str, breast_cancer_silos: Silos, tmp_path: Path, independent_epsilon: Callable[..., float]
) -> None:
    """Every local step is charged: Ditto's personal steps as well as its global ones,
    finetuning's rounds as well as the federated ones."""
    algorithm = ALGORITHMS[name]()
    silos = breast_cancer_silos(3)
    rounds, passes = 3, 2 if name == "ditto" else 1
    result = _simulate(algorithm, silos, rounds, ledger=tmp_path / "l")
    for silo in silos:
        steps = rounds * passes * algorithm.local_steps(silo)
        expected = independent_epsilon(1.0, 16 / silo.size, steps)
        assert result.epsilon[0][silo.name].epsilon == pytest.approx(expected, rel=1e-9)
    with Ledger(tmp_path / "l", create=False) as ledger:
        assert len(ledger.entries(account(silos[0], 0))) == rounds * passes


def test_mrmtl_with_lambda_zero_is_local_training_bit_for_bit(
    breast_cancer_silos: Silos, tmp_path: Path
) -> None:
    silos = breast_cancer_silos(3)
    kwargs = {"rounds": 3, "trials": 2, "seed": 3}
    local, local_models = _run(_make(Local), silos, **kwargs)
    mrmtl, mrmtl_models = _run(_make(MRMTL, strength=0.0), silos, **kwargs)
    for name in local_models:
        assert torch.equal(local_models[name], mrmtl_models[name])
    assert local.epsilon == mrmtl.epsilon
    assert local.traffic == {}  # local training sends nothing
    assert mrmtl.traffic[account(silos[0], 0)] == {"down": 3 * 124, "up": 3 * 124, "messages": 6}


def test_mrmtl_with_a_large_lambda_ties_the_silos_to_the_average(
    breast_cancer_silos: Silos, tmp_path: Path
) -> None:
    """λ = 1/η, the strongest pull of the explicit step: each step restarts from w̄, so the
    silos' models end one noisy step from it; the federation is nearly one model."""
    silos = breast_cancer_silos(3)
    apart, apart_models = _run(_make(MRMTL, strength=0.0), silos, rounds=5)
    tied, tied_models = _run(_make(MRMTL, strength=2.0), silos, rounds=5)
    assert _spread(tied_models, tied.params) < 0.25 * _spread(apart_models, apart.params)
    assert tied.final_metrics()["auroc"] > 0.95


def test_ditto_trains_fedavg_and_personal_models_on_fresh_randomness(
    breast_cancer_silos: Silos, tmp_path: Path
) -> None:
    """Ditto's global model is FedAvg's, bit for bit; with λ = 0 its personal models are
    local training, yet differ from `Local`'s: the second pass draws fresh batches and
    noise instead of replaying those of the first."""
    silos = breast_cancer_silos(3)
    fedavg = _simulate(_make(FedAvg), silos, 3)
    ditto, ditto_models = _run(_make(Ditto, strength=0.0), silos, rounds=3)
    _, local_models = _run(_make(Local), silos, rounds=3)
    for name in fedavg.params:
        assert torch.equal(ditto.params[name], fedavg.params[name])
        assert not torch.equal(ditto_models[name], local_models[name])
    assert ditto.traffic == fedavg.traffic  # the personal steps need no extra message


def test_finetune_is_fedavg_then_local_training(breast_cancer_silos: Silos, tmp_path: Path) -> None:
    """All rounds federated: FedAvg bit for bit. One federated round of three: the shared
    model stops after it (so does the traffic, once that model has gone down) while each
    silo trains its own copy."""
    silos = breast_cancer_silos(3)
    fedavg = _simulate(_make(FedAvg), silos, 3)
    federated, models = _run(_make(Finetune, federated_rounds=3), silos, rounds=3)
    for name in fedavg.params:
        assert torch.equal(federated.params[name], fedavg.params[name])
        assert torch.equal(models[name], fedavg.params[name].unsqueeze(1).expand_as(models[name]))
    once = _simulate(_make(FedAvg), silos, 1)
    tuned, tuned_models = _run(_make(Finetune, federated_rounds=1), silos, rounds=3)
    for name in once.params:
        assert torch.equal(tuned.params[name], once.params[name])
    # one more message each: the last federated model goes down once more, to be finetuned
    assert tuned.traffic == {
        silo: {**sent, "down": 2 * sent["down"], "messages": sent["messages"] + 1}
        for silo, sent in once.traffic.items()
    }
    assert _spread(tuned_models, tuned.params) > 0.1


@pytest.mark.parametrize("name", ALGORITHMS)
def test_same_seed_same_models_bit_for_bit(
    name: str, breast_cancer_silos: Silos, tmp_path: Path
) -> None:
    silos = breast_cancer_silos(3)
    runs: list[tuple[SimulationResult, Params]] = [
        _run(ALGORITHMS[name](), silos, rounds=2, trials=2, seed=seed) for seed in (5, 5, 6)
    ]
    (_, first), (_, again), (_, other) = runs
    for n in first:
        assert torch.equal(first[n], again[n])
        assert not torch.equal(first[n], other[n])
        assert not torch.equal(first[n][0], first[n][1])  # trials differ


def test_non_private_variants_charge_nothing(breast_cancer_silos: Silos) -> None:
    for name in ("local", "mrmtl", "ditto", "finetune"):
        algorithm = ALGORITHMS[name]().with_noise(0.0)
        result = _simulate(algorithm, breast_cancer_silos(3), 2)
        assert result.epsilon == [{}]


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(TypeError, match="clients_per_round"):  # cross-silo: no such field
        _make(MRMTL, clients_per_round=2)
    with pytest.raises(ValueError, match="diverge"):
        _make(Ditto, strength=4.0)  # η·λ = 2
    with pytest.raises(ValueError, match="≥ 0"):
        _make(MRMTL, strength=-1.0)
    with pytest.raises(ValueError, match="federated_rounds"):
        _make(Finetune, federated_rounds=-1)
