"""Scoring models on the silos' held-out test sets (released without noise: outside ε,
which protects the training records only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from dpfl.federation.metrics import classification_metrics
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params

SiloModels = Sequence[Sequence[Params]]
"""Per silo (in the run's order), the model it uses in each trial."""


def probabilities(logits: Tensor) -> np.ndarray:
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits.squeeze(-1)).double().numpy()
    return torch.softmax(logits.double(), dim=-1).numpy()


def scores(model: nn.Module, params: Params, x: Tensor) -> np.ndarray:
    with torch.no_grad():
        return probabilities(functional_call(model, params, (x,)))


def evaluate(
    model: nn.Module, models: SiloModels, silos: Sequence[Silo], round_: int
) -> list[dict[str, Any]]:
    """Per trial: metrics on the union of the silos' test sets, each scored by its own
    silo's model, and each silo's own."""
    scored = [
        (silo, [scores(model, params, silo.x_test) for params in models[k]])
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
            "metrics": classification_metrics(
                labels, np.concatenate([trial_scores[r] for _, trial_scores in scored])
            ),
            "silos": {
                silo.name: classification_metrics(silo.y_test.numpy(), trial_scores[r])
                for silo, trial_scores in scored
                if silo.y_test is not None
            },
        }
        for r in range(len(scored[0][1]))
    ]
