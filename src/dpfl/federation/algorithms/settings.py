"""An algorithm's settings, as a study's `[algorithm]` gives them: one pydantic model per
algorithm, declared in the algorithm's own module beside the algorithm, which also says
how the algorithm is built from them (`build`). Every settings model shares the DP-SGD
settings below; each adds its own, and refuses any other key.

A study checks its `[algorithm]` against the settings of the algorithm it names (the
registry, `dpfl.federation.algorithms.SETTINGS`); facts that need the rest of the study
(the model, the budget, the secure sum) are the algorithm's class attributes, which the
study reads."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from torch import nn

from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.server_optimizers import AveragingSettings, ServerOptimizerSettings
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import Loss
from dpfl.local.mechanisms import IndependentSettings, MechanismSettings

LossName = Literal["bce", "cross_entropy", "focal", "weighted_bce", "logistic_hazard", "cox"]
Weighting = Literal["size", "uniform"] | None
"""How a server averages models: weighted by silo size (None: the algorithm's default,
size) or uniform (Kerkouche's 1/|K|)."""


@dataclass(frozen=True)
class Parts:
    """What an algorithm is built from besides its settings: the study's model (its
    initialisation drawn from the study's seed) and loss, the silos, and the public
    facts of the study's privacy and length."""

    model: nn.Module
    loss: Loss
    silos: Sequence[Silo]
    private: bool
    noise_multiplier: float | None
    epsilon: float | None
    delta: float
    rounds: int


class DPSGDSettings(BaseModel, ABC):
    """The settings every algorithm shares: the local DP-SGD step's, and the loss.
    Non-finite numbers are errors, and so are keys of no algorithm. Another algorithm's
    setting is kept, checked by its owner's rules and never read (a study's grid over
    algorithms shares one `[algorithm]` table), unless its owner declares it
    `exclusive`."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    algorithm: ClassVar[type[Algorithm]]
    """The algorithm these settings build, whose class facts a study checks."""
    refuses_adam: ClassVar[str] = ""
    """Why the algorithm cannot take Adam's steps, if it cannot."""
    refuses_noise: ClassVar[str] = ""
    """Why the algorithm's noise cannot be other than independent, if it cannot."""
    refuses_server: ClassVar[str] = ""
    """Why the algorithm's server cannot take an optimiser's steps, if it cannot."""
    exclusive: ClassVar[frozenset[str]] = frozenset()
    """Its own settings that a study of another algorithm may not set (off their
    default): they would silently do nothing there."""

    name: str
    learning_rate: float = Field(0.5, gt=0)
    clip_norm: float = Field(1.0, gt=0)
    expected_batch_size: float = Field(16.0, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    """Local optimiser of the DP-SGD steps; adam is post-processing of the noisy gradient
    (the same ε), FLamby's baselines' choice; its state restarts at each local training.
    Refused where the algorithm says why (`refuses_adam`)."""
    loss: LossName | None = None
    """Default: bce for two classes, cross_entropy for more, logistic_hazard for survival
    (discrete-time, over `model.time_bins`); cox, the partial likelihood, only without
    privacy (its risk sets couple patients, so per-example clipping bounds nothing)."""
    sampling: Literal["poisson", "balanced"] = "poisson"
    """Local batches: "poisson", or "balanced", Kerkouche's downsampling of each Poisson
    batch to as many records of each class as the rarer has (two classes; charged at σ/2,
    since one record then moves the clipped sum by up to 2C)."""
    positive_weight: float = Field(1.0, gt=0)
    """weighted_bce's weight of the positive class."""
    noise: MechanismSettings = IndependentSettings()
    """How each DP-SGD step's noise is drawn (`dpfl.local.mechanisms`): "independent"
    (DP-SGD's), "bandmf" or "blt" (correlated over the run), by name or as a table with
    the mechanism's settings (`[algorithm.noise] mechanism = "bandmf"`, `band = 8`)."""
    server: ServerOptimizerSettings = AveragingSettings()
    """How the server moves the global model by each round's aggregate
    (`dpfl.federation.server_optimizers`): "averaging" (the aggregate itself), "fedavgm",
    "fedadagrad", "fedadam" or "fedyogi", by name or as a table with the optimiser's
    settings (`[algorithm.server] optimizer = "fedadam"`, `learning_rate = 0.01`).
    Post-processing of released replies: no ε."""

    @model_validator(mode="before")
    @classmethod
    def _others_settings(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        from dpfl.federation.algorithms import SETTINGS  # the registry imports this module

        kept = dict(raw)
        for key, value in raw.items():
            owners = [s for s in SETTINGS.values() if key in s.model_fields]
            if key in cls.model_fields:
                continue
            if not owners:
                raise ValueError(f"algorithm.{key}: unknown key (no algorithm has it)")
            field = owners[0].model_fields[key]
            checked: Any = Annotated[field.annotation, field]  # the owner's type and bounds
            kept[key] = TypeAdapter(checked).validate_python(value)
            owner = next((s for s in owners if key in s.exclusive), None)
            if owner is not None and kept[key] != field.get_default(call_default_factory=True):
                raise ValueError(f"algorithm.{key} is {owner.algorithm.name}'s")
        return kept

    def others(self) -> dict[str, Any]:
        """Other algorithms' settings kept beside these (never read), where not at their
        owner's default."""
        from dpfl.federation.algorithms import SETTINGS

        extra = self.model_extra or {}
        return {
            key: value
            for key, value in extra.items()
            if any(
                value != other.model_fields[key].get_default(call_default_factory=True)
                for other in SETTINGS.values()
                if key in other.model_fields
            )
        }

    @model_validator(mode="after")
    def _steps_it_can_take(self) -> Self:
        if self.optimizer == "adam":
            if self.refuses_adam:
                raise ValueError(
                    f"algorithm.optimizer 'adam' is not for {self.name}: {self.refuses_adam}; "
                    "use 'sgd'"
                )
            if self.momentum:
                raise ValueError(
                    "algorithm.optimizer 'adam' takes no algorithm.momentum (Adam's first "
                    "moment is its momentum): leave momentum at 0"
                )
        if self.sampling == "balanced" and not getattr(self.algorithm, "balances_batches", False):
            raise ValueError(f"algorithm.sampling: {self.name} cannot draw balanced batches")
        if self.refuses_server and not isinstance(self.server, AveragingSettings):
            raise ValueError(
                f"algorithm.server {self.server.optimizer!r} is not for {self.name}: "
                f"{self.refuses_server}"
            )
        if self.refuses_noise and not isinstance(self.noise, IndependentSettings):
            raise ValueError(
                f"algorithm.noise {self.noise.mechanism!r} is not for {self.name}: "
                f"{self.refuses_noise}"
            )
        return self

    @abstractmethod
    def build(self, parts: Parts) -> Algorithm:
        """The algorithm these settings describe."""

    def common(self, parts: Parts) -> dict[str, Any]:
        """The keyword arguments every DP-SGD algorithm takes: model, loss, its DP-SGD
        step (the study's σ; without one, σ = 1, which only stands until the run's plan
        calibrates it before round 0, `dpfl.engines.plan.RunPlan.calibrate`, decided in
        `dpfl.experiments.study.plan.plan_of`; no clipping when not private) and its
        batches."""
        dpsgd = (
            DPSGDConfig(
                self.clip_norm,
                parts.noise_multiplier or 1.0,
                self.learning_rate,
                self.momentum,
                optimizer=self.optimizer,
            )
            if parts.private
            else DPSGDConfig.non_private(
                self.learning_rate, self.momentum, optimizer=self.optimizer
            )
        )
        return {
            "model": parts.model,
            "loss": parts.loss,
            "dpsgd": dpsgd,
            "expected_batch_size": self.expected_batch_size,
            "balanced": self.sampling == "balanced",
            "noise": self.noise.build(parts.rounds),
            "server_optimizer": self.server.build(),
        }


class LocalTrainingSettings(DPSGDSettings):
    """Settings of algorithms whose silos train for some local epochs each round."""

    local_epochs: float = Field(1.0, gt=0)
    """Local epochs per round."""


def weighted(weighting: str | None) -> dict[str, Any]:
    """The `weighting` keyword of an algorithm that averages models, where one is set."""
    return {} if weighting is None else {"weighting": weighting}
