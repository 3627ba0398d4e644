"""Finetuning: FedAvg, then each silo trains the federated model further on its own data.

Rounds 0 … `federated_rounds` − 1 are FedAvg rounds; in round `federated_rounds` each
silo receives the last federated model and from then on trains it alone, the same
`local_epochs` of Poisson DP-SGD a round, sending nothing. A round of either kind costs a
silo the same local steps, all charged. The seed's caveat (Fig. 2): finetuning drops the
noise reduction that the averaging gave, so under DP it may not improve on FedAvg.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from dpfl.federation.algorithms.base import (
    Algorithm,
    Instruction,
    Job,
    LocalEpochs,
    Member,
    Outcome,
    Reply,
    State,
    broadcast,
    check_weighting,
    received,
)
from dpfl.federation.algorithms.fedavg import apply_sum, update_replies
from dpfl.federation.algorithms.local import train_alone
from dpfl.federation.algorithms.settings import LocalTrainingSettings, Parts, Weighting, weighted
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo


@dataclass(frozen=True)
class Finetune(LocalEpochs):
    federated_rounds: int = 1
    """Rounds of FedAvg before the silos finetune alone."""
    weighting: Literal["size", "uniform"] = "size"

    name: ClassVar[str] = "finetune"
    threat_model: ClassVar[str] = (
        "The server sees the federated phase's updates; fine-tuning steps are charged."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.federated_rounds < 0:
            raise ValueError(f"federated_rounds must be ≥ 0, got {self.federated_rounds}")
        check_weighting(self.weighting)

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        if round <= self.federated_rounds:  # the last federated model goes out once more
            return broadcast(state, silos)
        return {s.name: Instruction(None, tuple(silos)) for s in silos}

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        if members[0].ctx.round >= self.federated_rounds:
            return train_alone(self, members)
        trained = self.train([Job(received(m), m) for m in members])
        replies = update_replies(members, [t.params for t in trained], self.weighting)
        return [(reply, m.state) for reply, m in zip(replies, members, strict=True)]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        return apply_sum(state, replies, secure_sum)


class FinetuneSettings(LocalTrainingSettings):
    algorithm: ClassVar[type[Algorithm]] = Finetune

    name: Literal["finetune"]
    weighting: Weighting = None
    federated_rounds: int = Field(1, ge=1)
    """Rounds of FedAvg before local fine-tuning."""

    def build(self, parts: Parts) -> Finetune:
        return Finetune(
            **self.common(parts),
            local_epochs=self.local_epochs,
            **weighted(self.weighting),
            federated_rounds=self.federated_rounds,
        )
