"""Finetuning: FedAvg, then each silo trains the federated model further on its own data.

Rounds 0 … `federated_rounds` − 1 are FedAvg rounds; every later round is a local
training round of the same `local_epochs` of Poisson DP-SGD, from the last federated
model, with no messages. A round of either kind costs a silo the same local steps, all
charged. The seed's caveat (Fig. 2): finetuning drops the noise reduction that the
averaging gave, so under DP it may not improve on FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.federation.algorithms.base import RoundContext, State
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.algorithms.local import Local, broadcast
from dpfl.federation.silo import Silo


@dataclass(frozen=True)
class Finetune(Local):
    federated_rounds: int = 1
    """Rounds of FedAvg before the silos finetune alone."""

    name = "finetune"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.federated_rounds < 0:
            raise ValueError(f"federated_rounds must be ≥ 0, got {self.federated_rounds}")

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        if context.round >= self.federated_rounds:
            return super().run_round(state, silos, context)
        global_model = FedAvg.run_round(self, state, silos, context)["global"]
        return {"global": global_model, "personal": broadcast(global_model, len(silos))}
