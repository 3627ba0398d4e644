"""Federated approximate output perturbation (A*STAR, Meftah et al., Algorithm 3).

T epochs (one engine round each): every silo minimises its regularised logistic loss from
the current global parameters until ‖∇J‖ ≤ γ and releases the minimiser with Gaussian
noise, (ε/T, δ/T)-DP (Algorithm 2); the server averages the K releases (line 7). Each
release is charged as an (ε/T, δ/T) event, and the ledger composes them by basic
composition, as the paper does (§3.5): after T epochs a silo has spent (ε, δ).

dpfl's `output_perturbation` calibrates σ to a sensitivity that holds, Δ = (L + 2nγ)/Λ
with n the silo's public size, not the paper's nγ/Λ (see that module); it supports
logistic regression (`nn.Linear`) with `bce` or `cross_entropy` only. Under a patient unit
with a declared cap k (max_records) each patient keeps their first k records and
Δ = (kL + 2nγ)/Λ, n the public number of patients; without a cap it refuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field
from torch import nn

from dpfl.federation.algorithms.base import (
    Algorithm,
    Instruction,
    Member,
    Outcome,
    Reply,
    State,
    flat,
    received,
    record_level,
    unflat,
)
from dpfl.federation.algorithms.settings import DPSGDSettings, Parts
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
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

    name: ClassVar[str] = "aop"
    threat_model: ClassVar[str] = (
        "A*STAR output perturbation: each hospital releases a noisy minimiser per epoch; "
        "the server and the other hospitals see those releases. Basic composition over "
        "the epochs."
    )
    mechanism: ClassVar[str] = (
        "approximate output perturbation (Gaussian), basic composition over epochs"
    )
    sets_own_noise: ClassVar[bool] = True
    needs_linear_model: ClassVar[bool] = True
    patient_bound: ClassVar[str] = (
        "each patient keeps their first max_records = k records and each release's noise "
        "covers them: sensitivity (kL + 2nγ)/Λ, n the public number of patients"
    )

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

    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """One (ε/T, δ/T) release per round, for every silo, under its unit: a record, or
        a patient with at most max_records records (refused without that cap)."""
        record_level(
            self.name, silo, group_bound="each move the minimiser by up to L/Λ", capped=True
        )
        release = self.epoch_config
        return events.approximate_dp(release.epsilon, release.delta, neighbouring=silo.neighbouring)

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        if round >= self.epochs:
            raise ValueError(
                f"A*STAR's run has T = {self.epochs} epochs; round {round} would spend "
                f"beyond (ε={self.config.epsilon:g}, δ={self.config.delta:g})"
            )
        return super().configure(state, round, silos, rng, exchange)

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        """Each hospital's noisy minimiser of the records its sensitivity covers
        (`Silo.capped`, which `output_perturbation` keeps as they are), charged before it
        is released."""
        outcomes: list[Outcome] = []
        for m in members:
            silo = m.silo.capped
            result = output_perturbation(
                self.model,
                received(m),
                (silo.x, silo.y),
                self.loss,
                self.epoch_config,
                silo.declared_size,
                noise=m.ctx.noise(),
                units=silo.units,
                max_records=silo.max_records,
            )
            m.ctx.charge(result.event)
            outcomes.append((Reply(flat(result.params)), m.state))
        return outcomes

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        """The mean of the K releases (Algorithm 3, line 7)."""
        total = secure_sum({name: r.vector for name, r in replies.items()}).total
        glob: Params = state["global"]
        return {**state, "global": unflat(total / len(replies), glob)}


class AOPSettings(DPSGDSettings):
    """AOP reads the shared settings' loss (and positive_weight) only: it runs no SGD
    steps."""

    algorithm: ClassVar[type[Algorithm]] = AOP
    refuses_adam: ClassVar[str] = "it runs no SGD steps"
    refuses_noise: ClassVar[str] = "it perturbs its output once and runs no DP-SGD steps"
    refuses_server: ClassVar[str] = "its mean of the releases is A*STAR's model itself"

    name: Literal["aop"]
    regularization: float = Field(0.01, gt=0)
    """Λ."""
    gradient_tolerance: float = Field(1e-4, gt=0)
    """γ, the bound on the minimiser's gradient norm."""
    feature_norm_bound: float = Field(1.0, gt=0)
    """R, every record's feature norm (rows are clipped to it)."""

    def build(self, parts: Parts) -> AOP:
        if not isinstance(parts.model, nn.Linear):
            raise ValueError("aop needs model.kind = 'logistic_regression'")
        assert parts.epsilon is not None  # checked by the study
        config = AOPConfig(
            parts.epsilon,
            parts.delta,
            self.regularization,
            self.gradient_tolerance,
            self.feature_norm_bound,
        )
        return AOP(model=parts.model, loss=parts.loss, config=config, epochs=parts.rounds)
