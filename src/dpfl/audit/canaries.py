"""Canaries: records an auditor plants in one silo, and how a released model scores them.

Two kinds:

* `InputCanary`: an ordinary record (x, y), e.g. an outlier with a flipped label; its
  score is the model's log-likelihood of y at x (higher: more likely trained on).
* `GradientCanary`: a record whose per-example gradient has the same direction at every
  model, so DP-SGD clips it to exactly C·u for a fixed u (the strongest influence one
  record may have). Its loss is −z₀ (z the model's logits), whose gradient in z is the
  constant −e₀: for a linear model the gradient is −e₀ ⊗ (x, 1), and a DP-SGD step with it
  raises z₀(x) by a fixed amount. Its score is z₀(x). It is marked by the label −1, which
  `with_gradient_canaries` teaches the algorithm's loss (every other record's loss is
  unchanged, so the mechanism is the one audited). The direction is fixed for linear
  models (logistic regression); in a deeper model the canary is still one record, so
  the audit stays sound, but no longer the worst case. Output perturbation (AOP) needs
  its own Lipschitz losses: audit it with input canaries.

Planting keeps the silo's public size: under add/remove neighbouring the mechanism is
shaped by the public size only, so the worlds with and without the canary differ in the
one record, as the guarantee assumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.losses import Loss

__all__ = [
    "CANARY_LABEL",
    "GradientCanary",
    "InputCanary",
    "dirac_canaries",
    "outlier_canaries",
    "outlier_canary",
    "plant",
    "scores",
    "with_gradient_canaries",
]

CANARY_LABEL = -1
"""The label that marks a gradient canary's record."""

_A = TypeVar("_A", bound=Algorithm)


@dataclass(frozen=True)
class InputCanary:
    """A record (x, y) planted as it is; scored by the model's log-likelihood of y."""

    x: Tensor
    y: int

    @property
    def label(self) -> int:
        return self.y


@dataclass(frozen=True)
class GradientCanary:
    """A record at input x whose clipped gradient is C·(x, 1)/‖(x, 1)‖ ⊗ e₀ at every model
    (‖(x, 1)‖ must reach C for the clip to bind); scored by the logit z₀(x)."""

    x: Tensor

    @property
    def label(self) -> int:
        return CANARY_LABEL


Canary = InputCanary | GradientCanary


def plant(silo: Silo, canaries: Sequence[Canary]) -> Silo:
    """`silo` with the canaries' records appended; its public size stays what it was (a
    silo without one gets its true size declared, the study design of both worlds)."""
    public = silo.public_size if silo.public_size is not None else silo.size
    if not canaries:
        return silo.with_public_size(public)
    x = torch.cat([silo.x, torch.stack([c.x for c in canaries]).to(silo.x.dtype)])
    y = torch.cat([silo.y, torch.tensor([c.label for c in canaries], dtype=silo.y.dtype)])
    return dataclasses.replace(silo, x=x, y=y, public_size=public)


def scores(model: nn.Module, params: Params, canaries: Sequence[Canary]) -> Tensor:
    """[trials, canaries]: each canary's score under each of the stacked models `params`."""
    x = torch.stack([c.x for c in canaries])

    def logits(p: Params) -> Tensor:
        out: Tensor = functional_call(model, p, (x.to(next(iter(p.values())).dtype),))
        return out

    with torch.no_grad():
        z = vmap(logits)(params)  # [trials, canaries, outputs]
    columns = []
    for k, canary in enumerate(canaries):
        logit = z[:, k]
        if isinstance(canary, GradientCanary):
            columns.append(logit[:, 0])
        elif logit.shape[-1] == 1:  # log σ(±z): the log-likelihood of the binary label
            sign = 1.0 if canary.y == 1 else -1.0
            columns.append(nn.functional.logsigmoid(sign * logit[:, 0]))
        else:
            columns.append(torch.log_softmax(logit, dim=-1)[:, canary.y])
    return torch.stack(columns, dim=1).double()


def with_gradient_canaries(algorithm: _A) -> _A:
    """The algorithm with its loss taught the canary label: −z₀ on a canary's record, the
    loss as it was on every other (the mechanism on real records is unchanged)."""
    loss = getattr(algorithm, "loss", None)
    if loss is None or not dataclasses.is_dataclass(algorithm):
        raise ValueError(f"{algorithm.name} has no loss to plant gradient canaries through")
    if algorithm.sets_own_noise:
        raise ValueError(
            f"{algorithm.name}'s guarantee assumes its own Lipschitz losses: use input canaries"
        )
    return dataclasses.replace(algorithm, loss=_canary_loss(loss))


def _canary_loss(base: Loss) -> Loss:
    def loss(logits: Tensor, target: Tensor) -> Tensor:
        canary = target == CANARY_LABEL
        real = base(logits, torch.where(canary, torch.zeros_like(target), target))
        return torch.where(canary, -logits[..., 0], real)

    return loss


def dirac_canaries(silo: Silo, count: int, magnitude: float) -> list[GradientCanary]:
    """`count` gradient canaries on the silo's least used features (smallest Σ|x|), one
    feature each, x = magnitude·e_j: the real records' gradients barely touch their
    directions, so the noise is nearly all that hides them (Nasr et al. 2023's Dirac
    canaries, for linear models)."""
    features = silo.x.shape[1]
    if count > features:
        raise ValueError(f"{count} Dirac canaries need as many features, the silo has {features}")
    usage = silo.x.to_dense().abs().sum(0) if silo.x.is_sparse else silo.x.abs().sum(0)
    chosen = torch.argsort(usage, stable=True)[:count]
    return [GradientCanary(magnitude * nn.functional.one_hot(j, features).float()) for j in chosen]


def outlier_canary(silo: Silo) -> InputCanary:
    """A mislabeled outlier: the silo's record of largest norm with its label changed
    (binary: flipped; classes: the next one), the record a model must memorise to fit."""
    return outlier_canaries(silo, 1)[0]


def outlier_canaries(silo: Silo, count: int) -> list[InputCanary]:
    """The silo's `count` records of largest norm, each with its label changed."""
    if not 0 < count <= silo.size:
        raise ValueError(f"{count} outlier canaries from a silo of {silo.size} records")
    x = silo.x.to_dense() if silo.x.is_sparse else silo.x
    largest = torch.argsort(torch.linalg.vector_norm(x, dim=1), descending=True, stable=True)
    classes = max(int(silo.y.max()) + 1, 2)
    return [InputCanary(x[i].clone(), (int(silo.y[i]) + 1) % classes) for i in largest[:count]]
