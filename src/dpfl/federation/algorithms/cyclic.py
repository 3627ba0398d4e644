"""Cyclic DP federated learning (Owkin, iDASH 2020, Algorithm 2).

The silos train in turn: each runs E Poisson DP-SGD steps on the current model and
passes it to the next; N such rounds. For a silo, the other silos' steps are
post-processing, so its account composes only its own N·E steps (Owkin, Theorem 9).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.federation.algorithms.base import DPSGDAlgorithm, RoundContext, State
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params


@dataclass(frozen=True)
class Cyclic(DPSGDAlgorithm):
    steps_per_visit: int = 10

    name = "cyclic"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps_per_visit < 1:
            raise ValueError(f"steps_per_visit must be ≥ 1, got {self.steps_per_visit}")

    def local_steps(self, silo: Silo) -> int:
        return self.steps_per_visit

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        return {"global": self.initial_global(trials)}

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        model: Params = {name: v.clone() for name, v in state["global"].items()}
        message = payload_bytes(Encoding.FLOAT32, sum(v[0].numel() for v in model.values()))
        for k in range(len(silos)):
            members = [(r, k) for r in range(context.trials)]
            starts = [{name: v[r] for name, v in model.items()} for r in range(context.trials)]
            trained = self.train(starts, members, silos, context)
            for r in range(context.trials):
                for name in model:
                    model[name][r] = trained[r][name]
                context.traffic(r, k, message, message)  # receives the model, passes it on
        return {"global": model}
