"""Scoring models on the silos' held-out test sets (released without noise: outside ε,
which protects the training records only): each silo's model on its own test set and the
union (`evaluate`, every evaluated round), and, when asked, every silo's model on every
silo's test set (`cross_evaluate`, the FLamby convention). Binary models predict from a
decision threshold (`chosen_thresholds`): 0.5, or one chosen on DP-released histograms
of training scores (each patient's first max_records under a patient unit), which the
training records pay for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from dpfl.federation.metrics import classification_metrics
from dpfl.federation.silo import Silo
from dpfl.federation.survival_metrics import survival_metrics
from dpfl.federation.threshold import FIXED, BalancedThreshold
from dpfl.local.clipping import Params, column_major_copy, column_major_weights
from dpfl.local.losses import Loss, time_cuts
from dpfl.local.noise import NoiseSource

SiloModels = Sequence[Sequence[Params]]
"""Per silo (in the run's order), the model it uses in each trial."""
Thresholds = Sequence[Sequence[float]]
"""Per silo (in the run's order), its model's decision threshold in each trial."""


def probabilities(logits: Tensor) -> np.ndarray:
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits.squeeze(-1)).double().numpy()
    return torch.softmax(logits.double(), dim=-1).numpy()


def scores(model: nn.Module, params: Params, x: Tensor) -> np.ndarray:
    with torch.no_grad():
        return probabilities(outputs(model, params, x))


def outputs(model: nn.Module, params: Params, x: Tensor) -> Tensor:
    """The model's outputs on `x`, a sparse input meeting its first weight held
    column-major as in training (`column_major_weights`): the same bits, and much faster
    for a large sparse weight (benchmarks/README.md)."""
    held = {k: column_major_copy(params[k]) for k in column_major_weights(model, x)}
    result: Tensor = functional_call(model, {**params, **held}, (x,))
    return result


def predictions(model: nn.Module, params: Params, x: Tensor, survival: bool) -> np.ndarray:
    """What the metrics read: class probabilities, or for survival the raw outputs (a
    risk score or hazard logits, see `survival_metrics`)."""
    if not survival:
        return scores(model, params, x)
    with torch.no_grad():
        raw: np.ndarray = outputs(model, params, x).double().numpy()
        return raw


def metrics(
    labels: np.ndarray,
    predicted: np.ndarray,
    loss: Loss | None,
    threshold: float | np.ndarray = FIXED,
) -> dict[str, float]:
    """Classification metrics of probabilities (binary ones predicted from `threshold`
    on), or survival metrics of outputs (the loss names the time intervals of hazard
    logits)."""
    if labels.ndim == 2:
        return survival_metrics(labels, predicted, None if loss is None else time_cuts(loss))
    return classification_metrics(labels, predicted, threshold)


def evaluate(
    model: nn.Module,
    models: SiloModels,
    silos: Sequence[Silo],
    round_: int,
    loss: Loss | None = None,
    thresholds: Thresholds | None = None,
) -> list[dict[str, Any]]:
    """Per trial: metrics on the union of the silos' test sets, each scored by its own
    silo's model, and each silo's own. `loss`: the model's, which survival metrics need
    to read hazard logits. `thresholds`: each silo's decision thresholds, reported among
    its metrics (default: 0.5 for all, not reported)."""
    scored = [
        (k, silo, [predictions(model, p, silo.x_test, silo.survival) for p in models[k]])
        for k, silo in enumerate(silos)
        if silo.x_test is not None and silo.y_test is not None
    ]
    if not scored:
        return []
    labels = np.concatenate([s.y_test.numpy() for _, s, _ in scored if s.y_test is not None])

    def cut(k: int, r: int) -> float:
        return FIXED if thresholds is None else thresholds[k][r]

    def own(k: int, silo: Silo, r: int, predicted: np.ndarray) -> dict[str, float]:
        assert silo.y_test is not None
        out = metrics(silo.y_test.numpy(), predicted, loss, cut(k, r))
        return out if thresholds is None or silo.survival else {**out, "threshold": cut(k, r)}

    return [
        {
            "round": round_,
            "trial": r,
            "metrics": metrics(
                labels,
                np.concatenate([trial_scores[r] for _, _, trial_scores in scored]),
                loss,
                np.concatenate([np.full(len(s[r]), cut(k, r)) for k, _, s in scored]),
            ),
            "silos": {silo.name: own(k, silo, r, s[r]) for k, silo, s in scored},
        }
        for r in range(len(scored[0][2]))
    ]


def chosen_thresholds(
    threshold: float | BalancedThreshold,
    model: nn.Module,
    models: SiloModels,
    silos: Sequence[Silo],
    noise: Callable[[int, int], NoiseSource] | None,
) -> list[list[float]]:
    """Each silo's decision threshold in each trial: a fixed (public) one, or one chosen
    on its `released_histograms`, summed over the silos where they all share one model.
    The caller charges the releases first."""
    trials = len(models[0]) if models else 0
    if not isinstance(threshold, BalancedThreshold):
        return [[threshold] * trials for _ in silos]
    released = released_histograms(threshold, model, models, silos, noise)
    if shares_one_model(models):
        pooled = [
            threshold.choose(np.sum([per_silo[r] for per_silo in released], axis=0))
            for r in range(trials)
        ]
        return [pooled for _ in silos]
    return [[threshold.choose(counts) for counts in per_silo] for per_silo in released]


def released_histograms(
    threshold: BalancedThreshold,
    model: nn.Module,
    models: SiloModels,
    silos: Sequence[Silo],
    noise: Callable[[int, int], NoiseSource] | None,
) -> list[list[np.ndarray]]:
    """Per silo, per trial: the histograms of its model's scores on the training records
    its sensitivity covers (`Silo.capped`: a patient's first max_records where the unit
    is the patient), released with noise `noise(trial, silo index)` (None: exact, for a
    non-private run)."""
    return [
        [
            threshold.release(
                scores(model, params, view.x),
                view.y.numpy(),
                None if noise is None else noise(r, k),
            )
            for r, params in enumerate(models[k])
        ]
        for k, view in enumerate(silo.capped for silo in silos)
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
    thresholds: Thresholds | None = None,
) -> list[dict[str, Any]]:
    """Per trial, every silo's model on every silo's test set (the FLamby convention):
    one row `{round, trial, model, test, metrics}` per (trial, model silo, test silo),
    a model predicting from its silo's threshold (`thresholds`, default 0.5).

    Where every silo uses the same model in every trial (a non-personalised algorithm),
    the rows collapse to one per (trial, test silo) with `model` None, "the shared
    model": scoring it once per silo would only repeat the same numbers."""
    tested = [s for s in silos if s.x_test is not None and s.y_test is not None]
    if not tested or not models:
        return []
    shared = shares_one_model(models)
    owners: list[tuple[str | None, int]] = (
        [(None, 0)] if shared else [(s.name, k) for k, s in enumerate(silos)]
    )
    rows = []
    for owner, k in owners:
        for r, params in enumerate(models[k]):
            for test in tested:
                assert test.x_test is not None and test.y_test is not None
                cut = FIXED if thresholds is None else thresholds[k][r]
                scored = metrics(
                    test.y_test.numpy(),
                    predictions(model, params, test.x_test, test.survival),
                    loss,
                    cut,
                )
                if thresholds is not None and not test.survival:
                    scored["threshold"] = cut
                rows.append(
                    {
                        "round": round_,
                        "trial": r,
                        "model": owner,
                        "test": test.name,
                        "metrics": scored,
                    }
                )
    return rows
