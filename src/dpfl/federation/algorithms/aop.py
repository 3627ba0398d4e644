"""Federated approximate output perturbation (A*STAR, Meftah et al., Algorithm 3).

T epochs (one engine round each): every silo minimises its regularised logistic loss from
the current global parameters until ‖∇J‖ ≤ γ and releases the minimiser with Gaussian
noise, (ε/T, δ/T)-DP (Algorithm 2); the server averages the K releases (line 7). Each
release is charged as an (ε/T, δ/T) event, and the ledger composes them by basic
composition, as the paper does (§3.5): after T epochs a silo has spent (ε, δ).

dpfl's `output_perturbation` calibrates σ to a sensitivity that holds, Δ = (L + 2nγ)/Λ
with n the silo's public size, not the paper's nγ/Λ (see that module); it supports
logistic regression (`nn.Linear`) with `bce` or `cross_entropy` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dpfl.federation import aggregators
from dpfl.federation.algorithms.base import Algorithm, RoundContext, State
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.losses import Loss
from dpfl.local.output_perturbation import AOPConfig, output_perturbation
from dpfl.privacy import events


@dataclass(frozen=True)
class AOP(Algorithm):
    """`config` holds the whole run's (ε, δ) with Λ, γ and R; `epochs` is T, the number of
    rounds the run may have (a round beyond T would spend beyond (ε, δ))."""

    model: nn.Linear
    loss: Loss
    config: AOPConfig
    epochs: int

    name = "aop"

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be ≥ 1, got {self.epochs}")

    @property
    def private(self) -> bool:
        return True

    @property
    def epoch_config(self) -> AOPConfig:
        """Each release's configuration: (ε/T, δ/T), Algorithm 3 lines 2-3."""
        return dataclasses.replace(
            self.config,
            epsilon=self.config.epsilon / self.epochs,
            delta=self.config.delta / self.epochs,
        )

    def participation_event(self, silo: Silo, silos: Sequence[Silo]) -> events.PrivacyEvent:
        """One (ε/T, δ/T) release per round, for every silo."""
        release = self.epoch_config
        return events.approximate_dp(release.epsilon, release.delta)

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        return {"global": self.initial_global(trials)}

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        if context.round >= self.epochs:
            raise ValueError(
                f"A*STAR's run has T = {self.epochs} epochs; round {context.round} would spend "
                f"beyond (ε={self.config.epsilon:g}, δ={self.config.delta:g})"
            )
        glob: Params = state["global"]
        release = self.epoch_config
        message = payload_bytes(Encoding.FLOAT32, sum(v[0].numel() for v in glob.values()))
        new_global = {name: v.clone() for name, v in glob.items()}
        for r in range(context.trials):
            start = {name: v[r] for name, v in glob.items()}
            released = []
            for k, silo in enumerate(silos):
                result = output_perturbation(
                    self.model,
                    start,
                    (silo.x, silo.y),
                    self.loss,
                    release,
                    silo.declared_size,
                    noise=context.noise(r, k),
                )
                context.charge(r, k, result.event)
                context.traffic(r, k, message, message)
                released.append(result.params)
            for name in new_global:
                stacked = torch.stack([p[name].flatten() for p in released])
                new_global[name][r] = aggregators.mean(stacked).reshape(new_global[name][r].shape)
        return {"global": new_global}
