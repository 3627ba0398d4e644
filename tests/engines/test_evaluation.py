"""Cross-silo scoring (`simulate(..., cross_silo=True)`): every silo's model on every
silo's test set, checked against scores computed here by hand (numpy and scikit-learn)
on the models `simulate` returns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn import metrics as skm
from sklearn.datasets import load_breast_cancer

from dpfl.data import partition
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import MRMTL, FedAvg
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression

_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)  # a test fixture: its own moments are fine here
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)


def _silos() -> list[Silo]:
    silos = []
    for k, idx in enumerate(partition.iid_stratified(_Y, 3, seed=1)):
        cut = int(0.8 * len(idx))
        train, test = idx[:cut], idx[cut:]
        silos.append(
            Silo.from_arrays(f"h{k}", _X[train], _Y[train], _X[test], _Y[test], public_size=cut)
        )
    return silos


def _by_hand(weight: np.ndarray, bias: np.ndarray, silo: Silo) -> dict[str, float]:
    """A logistic regression's metrics on the silo's test set, without dpfl's code."""
    assert silo.x_test is not None and silo.y_test is not None
    x, y = silo.x_test.double().numpy(), silo.y_test.numpy()
    p = 1 / (1 + np.exp(-(x @ weight.T.astype(np.float64) + bias.astype(np.float64))))[:, 0]
    return {
        "accuracy": skm.accuracy_score(y, p >= 0.5),
        "auroc": skm.roc_auc_score(y, p),
        "loss": skm.log_loss(y, p, labels=[0, 1]),
    }


def _check(row: dict[str, object], expected: dict[str, float]) -> None:
    metrics = row["metrics"]
    assert isinstance(metrics, dict)
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (row, name)


def test_personalised_models_are_scored_on_every_silos_test_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    mrmtl = MRMTL(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, strength=0.1)
    silos = _silos()
    result = simulate(
        mrmtl,
        silos,
        RunPlan(rounds=3, trials=2, seed=4, progress=False, cross_silo=True),
        ledger=tmp_path / "ledger.sqlite",
    )
    rows = result.cross_silo
    assert len(rows) == 2 * 3 * 3  # trials × model silos × test silos
    assert {r["round"] for r in rows} == {2}
    seen = set()
    for row in rows:
        model = result.silo_models[str(row["model"])]
        test = next(s for s in silos if s.name == row["test"])
        t = int(row["trial"])
        _check(row, _by_hand(model["weight"][t].numpy(), model["bias"][t].numpy(), test))
        seen.add((t, row["model"], row["test"]))
    assert len(seen) == len(rows)
    # personal models differ: a silo's model scores differently on the same test set
    on_h0 = {
        r["model"]: r["metrics"]["loss"] for r in rows if r["trial"] == 0 and r["test"] == "h0"
    }  # type: ignore[index]
    assert len(set(on_h0.values())) == 3
    # the diagonal is each silo's own score, as `evaluate` reported it
    for t, own in enumerate(result.silo_metrics):
        for name, metrics in own.items():
            (diagonal,) = [
                r for r in rows if (r["trial"], r["model"], r["test"]) == (t, name, name)
            ]
            assert diagonal["metrics"] == metrics


def test_a_shared_model_is_scored_once_per_test_silo(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    fedavg = FedAvg(model=logistic_regression(30), loss=bce, dpsgd=CONFIG)
    silos = _silos()
    result = simulate(
        fedavg,
        silos,
        RunPlan(rounds=2, trials=2, progress=False, cross_silo=True),
        ledger=tmp_path / "ledger.sqlite",
    )
    rows = result.cross_silo
    assert [(r["trial"], r["model"], r["test"]) for r in rows] == [
        (t, None, s.name) for t in range(2) for s in silos
    ]
    for row in rows:
        test = next(s for s in silos if s.name == row["test"])
        t = int(row["trial"])
        _check(
            row,
            _by_hand(result.params["weight"][t].numpy(), result.params["bias"][t].numpy(), test),
        )


def test_cross_silo_scoring_is_opt_in_and_changes_nothing_else(tmp_path) -> None:  # type: ignore[no-untyped-def]
    results = []
    for cross in (False, True):
        torch.manual_seed(0)
        mrmtl = MRMTL(model=logistic_regression(30), loss=bce, dpsgd=CONFIG)
        results.append(
            simulate(
                mrmtl,
                _silos(),
                RunPlan(rounds=2, trials=2, progress=False, cross_silo=cross),
                ledger=tmp_path / f"{cross}.sqlite",
            )
        )
    plain, crossed = results
    assert plain.cross_silo == [] and crossed.cross_silo
    assert plain.history == crossed.history
    assert plain.metadata["fingerprint"] == crossed.metadata["fingerprint"]
    for name, params in plain.silo_models.items():
        for key, value in params.items():
            assert torch.equal(value, crossed.silo_models[name][key])
    assert all(not math.isnan(r["metrics"]["accuracy"]) for r in crossed.cross_silo)


def test_sparse_inputs_are_scored_with_the_same_bits_faster_layout() -> None:
    """`outputs` holds the first weight column-major for a sparse input: the values are
    those of the plain call, bit for bit, and the caller's parameters are left as they
    were (row-major)."""
    from torch.func import functional_call

    from dpfl.engines.evaluation import outputs

    torch.manual_seed(0)
    x = ((torch.rand(64, 500) < 0.02).float() * torch.rand(64, 500)).to_sparse()
    for model in (
        torch.nn.Linear(500, 1),
        torch.nn.Sequential(torch.nn.Linear(500, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)),
    ):
        params = {k: v.detach() for k, v in model.named_parameters()}
        expected = functional_call(model, params, (x,))
        assert torch.equal(outputs(model, params, x), expected)
        assert all(v.is_contiguous() for v in params.values())
