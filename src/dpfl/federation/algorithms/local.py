"""Local training: each silo trains its own model on its own data and never communicates.

One end of puffle's personalisation spectrum (seed §1.2): no cost from heterogeneity,
no reduction of the silo's DP noise by averaging. Under silo-specific record-level DP a
round costs a silo exactly what a FedAvg round costs (the same local DP-SGD steps; being
averaged with others is post-processing), so it is the baseline that every personalised
algorithm must beat at equal ε. The server half sends nothing; the shared model stays
the common initial one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from dpfl.federation.algorithms.base import (
    Algorithm,
    DPSGDAlgorithm,
    Instruction,
    Job,
    LocalEpochs,
    LocalState,
    Member,
    Outcome,
    Reply,
    State,
)
from dpfl.federation.algorithms.settings import LocalTrainingSettings, Parts
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
from dpfl.local.clipping import Params


def personal(start: Params) -> LocalState:
    """A hospital's local state that holds its own model, starting from `start`."""
    return {"model": {name: v.clone() for name, v in start.items()}}


def train_alone(algorithm: DPSGDAlgorithm, members: Sequence[Member]) -> list[Outcome]:
    """Each member trains its own model from where it is (or from the model it was just
    sent) and sends nothing."""
    jobs = [
        Job(m.state["model"] if m.instruction.params is None else m.instruction.params, m)
        for m in members
    ]
    return [
        (None, {**m.state, "model": t.params})
        for m, t in zip(members, algorithm.train(jobs), strict=True)
    ]


@dataclass(frozen=True)
class Local(LocalEpochs):
    """`local_epochs` of Poisson DP-SGD a round at every silo, on its own model."""

    name: ClassVar[str] = "local"
    threat_model: ClassVar[str] = (
        "Nothing leaves a hospital during training; the released model is DP-SGD-trained."
    )
    sums_replies: ClassVar[bool] = False

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        return {s.name: Instruction(None, tuple(silos)) for s in silos}

    def initial_local_state(self, start: Params) -> LocalState:
        return personal(start)

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        return train_alone(self, members)

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        return state


class LocalSettings(LocalTrainingSettings):
    algorithm: ClassVar[type[Algorithm]] = Local
    refuses_server: ClassVar[str] = "its hospitals train alone, with no shared model"

    name: Literal["local"]

    def build(self, parts: Parts) -> Local:
        return Local(**self.common(parts), local_epochs=self.local_epochs)
