"""Golden runs of all ten algorithms: the models and ε of fixed seeds, written down before
the algorithms are split into hospital and server halves, so the split can be shown to
change nothing. `DPFL_UPDATE_GOLDEN=1 pytest tests/federation/test_golden.py` rewrites
the file; do that only for a change that is meant to move the numbers, and say why."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import (
    AOP,
    MRMTL,
    Algorithm,
    Centralized,
    Cyclic,
    Ditto,
    FedAvg,
    FedSGDSecure,
    Finetune,
    Local,
    Sign,
)
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.local.output_perturbation import AOPConfig
from dpfl.models import logistic_regression

GOLDEN = Path(__file__).parent / "golden" / "algorithms.json"
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5, momentum=0.5)


def _dpsgd(kind: Callable[..., Algorithm], **kwargs: Any) -> Callable[[], Algorithm]:
    def make() -> Algorithm:
        torch.manual_seed(0)
        return kind(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, **kwargs)

    return make


def _aop() -> Algorithm:
    torch.manual_seed(0)
    config = AOPConfig(2.0, 1e-5, regularization=5.0, gradient_tolerance=1e-3, feature_norm_bound=5)
    return AOP(model=logistic_regression(30), loss=bce, config=config, epochs=3)


ALGORITHMS: dict[str, Callable[[], Algorithm]] = {
    "fedavg": _dpsgd(FedAvg, local_epochs=0.5),
    "fedavg-sampled": _dpsgd(FedAvg, local_epochs=0.5, client_rate=0.6, weighting="uniform"),
    "sign": _dpsgd(Sign, local_epochs=0.5, server_learning_rate=0.01),
    "cyclic": _dpsgd(Cyclic, steps_per_visit=3),
    "fedsgd_secure": _dpsgd(FedSGDSecure),
    "aop": _aop,
    "mrmtl": _dpsgd(MRMTL, strength=0.5, local_epochs=0.5),
    "ditto": _dpsgd(Ditto, strength=0.5, local_epochs=0.5),
    "finetune": _dpsgd(Finetune, federated_rounds=2, local_epochs=0.5),
    "local": _dpsgd(Local, local_epochs=0.5),
    "centralized": _dpsgd(Centralized, epochs_per_round=0.2),
}


def _outcome(name: str, silos: list[Silo]) -> dict[str, Any]:
    """Every silo's model (both trials, flattened) and every silo's ε per trial."""
    result = simulate(
        ALGORITHMS[name](),
        silos,
        RunPlan(
            rounds=3, trials=2, seed=7, epsilon=8.0, eval_every=3, progress=False, init="shared"
        ),
    )
    return {
        "models": {
            silo: torch.cat([v.flatten(1) for v in params.values()], 1).tolist()
            for silo, params in result.silo_models.items()
        },
        "epsilon": [{s: r.epsilon for s, r in trial.items()} for trial in result.epsilon],
    }


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithms_give_the_golden_models_and_epsilons(
    name: str, breast_cancer_silos: Callable[[int], list[Silo]]
) -> None:
    outcome = _outcome(name, breast_cancer_silos(3))
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("DPFL_UPDATE_GOLDEN") == "1":
        golden[name] = outcome
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert name in golden, f"no golden run for {name}: set DPFL_UPDATE_GOLDEN=1 once"
    expected = golden[name]
    assert outcome["models"].keys() == expected["models"].keys()
    for silo, model in outcome["models"].items():
        torch.testing.assert_close(
            torch.tensor(model), torch.tensor(expected["models"][silo]), rtol=0, atol=1e-6
        )
    assert len(outcome["epsilon"]) == len(expected["epsilon"])
    for got, want in zip(outcome["epsilon"], expected["epsilon"], strict=True):
        assert got == pytest.approx(want, rel=1e-9)


def test_every_registered_algorithm_has_a_golden_run() -> None:
    """A new algorithm in the registry needs its golden run here too."""
    from dpfl.federation.algorithms import BY_NAME

    assert set(BY_NAME) <= set(ALGORITHMS)
