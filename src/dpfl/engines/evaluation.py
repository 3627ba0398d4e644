"""Scoring models on the silos' held-out test sets (released without noise: outside ε,
which protects the training records only): each silo's model on its own test set and the
union (`evaluate`, every evaluated round), and, when asked, every silo's model on every
silo's test set (`cross_evaluate`, the FLamby convention)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from dpfl.federation.metrics import classification_metrics
from dpfl.federation.silo import Silo
from dpfl.federation.survival_metrics import survival_metrics
from dpfl.local.clipping import Params
from dpfl.local.losses import Loss, time_cuts

SiloModels = Sequence[Sequence[Params]]
"""Per silo (in the run's order), the model it uses in each trial."""


def probabilities(logits: Tensor) -> np.ndarray:
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits.squeeze(-1)).double().numpy()
    return torch.softmax(logits.double(), dim=-1).numpy()


def scores(model: nn.Module, params: Params, x: Tensor) -> np.ndarray:
    with torch.no_grad():
        return probabilities(functional_call(model, params, (x,)))


def predictions(model: nn.Module, params: Params, x: Tensor, survival: bool) -> np.ndarray:
    """What the metrics read: class probabilities, or for survival the raw outputs (a
    risk score or hazard logits, see `survival_metrics`)."""
    if not survival:
        return scores(model, params, x)
    with torch.no_grad():
        raw: np.ndarray = functional_call(model, params, (x,)).double().numpy()
        return raw


def metrics(labels: np.ndarray, predicted: np.ndarray, loss: Loss | None) -> dict[str, float]:
    """Classification metrics of probabilities, or survival metrics of outputs (the
    loss names the time intervals of hazard logits)."""
    if labels.ndim == 2:
        return survival_metrics(labels, predicted, None if loss is None else time_cuts(loss))
    return classification_metrics(labels, predicted)


def evaluate(
    model: nn.Module,
    models: SiloModels,
    silos: Sequence[Silo],
    round_: int,
    loss: Loss | None = None,
) -> list[dict[str, Any]]:
    """Per trial: metrics on the union of the silos' test sets, each scored by its own
    silo's model, and each silo's own. `loss`: the model's, which survival metrics need
    to read hazard logits."""
    scored = [
        (silo, [predictions(model, p, silo.x_test, silo.survival) for p in models[k]])
        for k, silo in enumerate(silos)
        if silo.x_test is not None
    ]
    if not scored:
        return []
    labels = np.concatenate([s.y_test.numpy() for s, _ in scored if s.y_test is not None])
    return [
        {
            "round": round_,
            "trial": r,
            "metrics": metrics(
                labels, np.concatenate([trial_scores[r] for _, trial_scores in scored]), loss
            ),
            "silos": {
                silo.name: metrics(silo.y_test.numpy(), trial_scores[r], loss)
                for silo, trial_scores in scored
                if silo.y_test is not None
            },
        }
        for r in range(len(scored[0][1]))
    ]


def shares_one_model(models: SiloModels) -> bool:
    """Whether, in every trial, every silo uses the very same model (bit for bit): a
    non-personalised algorithm, whose cross-silo scores are one row per test silo."""
    return all(
        all(
            params.keys() == models[0][r].keys()
            and all(torch.equal(params[name], models[0][r][name]) for name in params)
            for params in (silo_models[r] for silo_models in models[1:])
        )
        for r in range(len(models[0]))
    )


def cross_evaluate(
    model: nn.Module,
    models: SiloModels,
    silos: Sequence[Silo],
    round_: int,
    loss: Loss | None = None,
) -> list[dict[str, Any]]:
    """Per trial, every silo's model on every silo's test set (the FLamby convention):
    one row `{round, trial, model, test, metrics}` per (trial, model silo, test silo).

    Where every silo uses the same model in every trial (a non-personalised algorithm),
    the rows collapse to one per (trial, test silo) with `model` None, "the shared
    model": scoring it once per silo would only repeat the same numbers."""
    tested = [s for s in silos if s.x_test is not None and s.y_test is not None]
    if not tested or not models:
        return []
    shared = shares_one_model(models)
    owners: list[tuple[str | None, Sequence[Params]]] = (
        [(None, models[0])] if shared else [(s.name, models[k]) for k, s in enumerate(silos)]
    )
    rows = []
    for owner, per_trial in owners:
        for r, params in enumerate(per_trial):
            for test in tested:
                assert test.x_test is not None and test.y_test is not None
                rows.append(
                    {
                        "round": round_,
                        "trial": r,
                        "model": owner,
                        "test": test.name,
                        "metrics": metrics(
                            test.y_test.numpy(),
                            predictions(model, params, test.x_test, test.survival),
                            loss,
                        ),
                    }
                )
    return rows
