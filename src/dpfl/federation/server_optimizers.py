"""The server's optimiser: how the global model moves by the round's aggregate.

An aggregating algorithm's server half turns the round's replies into a new global
model (`Algorithm.aggregate`: a weighted mean of updates, a majority of signs, a mean of
personal models). Its step from the old global model, Δ = aggregate − old, is the
pseudo-gradient of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021, Alg. 2);
a server optimiser moves the model by a function of Δ and of its own memory of earlier
Δs. Δ is computed from released replies only, so every optimiser here is
post-processing: it costs no ε and leaves every event as it was.

* `Averaging`: x ← x + Δ, the aggregate itself (FedAvg; the default).
* `FedAvgM` (Hsu et al. 2019): m ← βm + Δ, x ← x + ηm.
* `FedAdagrad`, `FedAdam`, `FedYogi` (Reddi et al.): m ← β₁m + (1 − β₁)Δ, a second
  moment v of their own (a sum, a mean, Yogi's additive rule), x ← x + ηm/(√v + τ);
  FedAdam's step is bias-corrected, η√(1 − β₂ᵗ)/(1 − β₁ᵗ) at its t-th step.

These are Flower's strategies of the same names, the same formulas (tested against
them), on one flat vector in the model's dtype: elementwise, so a simulator and a
deployment that feed them the same Δ get the same bits. The memory (m, v and the step
count) is server state, checkpointed with it (`State["server_optimizer"]`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from torch import Tensor

Memory = dict[str, Any]
"""An optimiser's state between rounds: tensors of the model's flat shape (and the
adaptive ones' count of `steps`)."""


@dataclass(frozen=True)
class ServerOptimizer(ABC):
    """x ← x + a step computed from Δ and the optimiser's memory."""

    name: ClassVar[str]

    @abstractmethod
    def step(self, delta: Tensor, memory: Memory) -> tuple[Tensor, Memory]:
        """The move of the global model for the round's Δ, and the new memory (`memory`
        is {} before the first step)."""

    def moved(self, old: Tensor, aggregate: Tensor, memory: Memory) -> tuple[Tensor, Memory]:
        """The new global model from the old one and the aggregate, and the new memory."""
        move, memory = self.step(aggregate - old, memory)
        return old + move, memory


@dataclass(frozen=True)
class Averaging(ServerOptimizer):
    """The aggregate as it is."""

    name: ClassVar[str] = "averaging"

    def step(self, delta: Tensor, memory: Memory) -> tuple[Tensor, Memory]:
        return delta, memory

    def moved(self, old: Tensor, aggregate: Tensor, memory: Memory) -> tuple[Tensor, Memory]:
        return aggregate, memory  # not old + (aggregate − old): those bits may differ


@dataclass(frozen=True)
class FedAvgM(ServerOptimizer):
    """Server momentum: m ← βm + Δ, x ← x + ηm (Flower's FedAvgM with server_momentum β
    and server_learning_rate η)."""

    learning_rate: float = 1.0
    momentum: float = 0.9

    name: ClassVar[str] = "fedavgm"

    def step(self, delta: Tensor, memory: Memory) -> tuple[Tensor, Memory]:
        velocity = delta if "m" not in memory else memory["m"] * self.momentum + delta
        return velocity * self.learning_rate, {"m": velocity}


@dataclass(frozen=True)
class Adaptive(ServerOptimizer):
    """Reddi et al.'s Algorithm 2: the first moment m of Δ, a second moment v of each
    optimiser's own, x ← x + ηm/(√v + τ)."""

    learning_rate: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    @abstractmethod
    def second_moment(self, v: Tensor, squared: Tensor) -> Tensor:
        """v after this round's Δ², from v (zeros before the first step)."""

    def rate(self, steps: int) -> float:
        """η at the `steps`-th step (1, 2, …)."""
        return self.learning_rate

    def step(self, delta: Tensor, memory: Memory) -> tuple[Tensor, Memory]:
        m = memory.get("m", torch.zeros_like(delta))
        v = memory.get("v", torch.zeros_like(delta))
        steps = memory.get("steps", 0) + 1
        m = m * self.beta1 + delta * (1 - self.beta1)
        v = self.second_moment(v, delta * delta)
        move = m * self.rate(steps) / (v.sqrt() + self.tau)
        return move, {"m": m, "v": v, "steps": steps}


@dataclass(frozen=True)
class FedAdagrad(Adaptive):
    """v ← v + Δ²."""

    name: ClassVar[str] = "fedadagrad"

    def second_moment(self, v: Tensor, squared: Tensor) -> Tensor:
        return v + squared


@dataclass(frozen=True)
class FedAdam(Adaptive):
    """v ← β₂v + (1 − β₂)Δ², the step bias-corrected (Kingma & Ba; Flower's FedAdam
    counts its rounds from one more, so its t-th step is our (t + 1)-th)."""

    name: ClassVar[str] = "fedadam"

    def second_moment(self, v: Tensor, squared: Tensor) -> Tensor:
        return v * self.beta2 + squared * (1 - self.beta2)

    def rate(self, steps: int) -> float:
        return self.learning_rate * math.sqrt(1 - self.beta2**steps) / (1 - self.beta1**steps)


@dataclass(frozen=True)
class FedYogi(Adaptive):
    """v ← v − (1 − β₂)Δ² sign(v − Δ²): v grows no faster than Adam's, and shrinks
    slowly."""

    name: ClassVar[str] = "fedyogi"

    def second_moment(self, v: Tensor, squared: Tensor) -> Tensor:
        return v - squared * (1 - self.beta2) * torch.sign(v - squared)


AVERAGING = Averaging()


class ServerSettings(BaseModel, ABC):
    """A study's `algorithm.server`: the optimiser by name and its settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    optimizer: str

    @abstractmethod
    def build(self) -> ServerOptimizer:
        """The optimiser these settings describe."""


class AveragingSettings(ServerSettings):
    optimizer: Literal["averaging"] = "averaging"

    def build(self) -> Averaging:
        return AVERAGING


class FedAvgMSettings(ServerSettings):
    optimizer: Literal["fedavgm"]
    learning_rate: float = Field(1.0, gt=0)
    """η, the server's step on its momentum."""
    momentum: float = Field(0.9, ge=0, lt=1)
    """β."""

    def build(self) -> FedAvgM:
        return FedAvgM(self.learning_rate, self.momentum)


class AdaptiveSettings(ServerSettings):
    optimizer: Literal["fedadagrad", "fedadam", "fedyogi"]
    learning_rate: float = Field(0.1, gt=0)
    """η, the server's learning rate (Flower's eta)."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """β₁ of the first moment."""
    beta2: float = Field(0.99, ge=0, lt=1)
    """β₂ of the second moment (not read by fedadagrad)."""
    tau: float = Field(1e-3, gt=0)
    """τ, the adaptivity: the step of a coordinate is at most about ηm/τ (Reddi et al.
    find 1e-3 a good default)."""

    def build(self) -> Adaptive:
        kinds: dict[str, type[Adaptive]] = {
            "fedadagrad": FedAdagrad,
            "fedadam": FedAdam,
            "fedyogi": FedYogi,
        }
        return kinds[self.optimizer](self.learning_rate, self.beta1, self.beta2, self.tau)


def _named(raw: Any) -> Any:
    """`server = "fedadam"` is `[algorithm.server] optimizer = "fedadam"` with its
    defaults."""
    return {"optimizer": raw} if isinstance(raw, str) else raw


ServerOptimizerSettings = Annotated[
    AveragingSettings | FedAvgMSettings | AdaptiveSettings,
    Field(discriminator="optimizer"),
    BeforeValidator(_named),
]
"""A study's `algorithm.server`: an optimiser's name, or a table naming it with its
settings."""
