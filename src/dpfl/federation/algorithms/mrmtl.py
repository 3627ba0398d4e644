"""MR-MTL: mean-regularised multi-task learning (puffle seed, §1.3).

Each silo k keeps its own model w_k across rounds and takes DP-SGD steps on
F_k(w) + λ/2‖w − w̄‖²: w_k ← w_k − η(g̃_k + λ(w_k − w̄)), g̃_k its noisy gradient. The
server keeps w̄, the mean of the silos' models after each round, and sends it back.
λ = 0 is local training; a large λ ties every w_k to w̄, FedAvg's end of the spectrum.
The pull only uses w̄, public to the silo, so a round costs what a FedAvg round costs
(seed, footnote 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpfl.federation import aggregators
from dpfl.federation.algorithms.base import RoundContext, State
from dpfl.federation.algorithms.local import Local, every_silo, member_params, restack
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.regularised import check_strength


@dataclass(frozen=True)
class MRMTL(Local):
    strength: float = 1.0
    """λ, the pull towards the anchor; η·λ must stay below 2(1 + momentum)."""

    name = "mrmtl"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_strength(self.dpsgd, self.strength)

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        members = every_silo(context.trials, len(silos))
        mean: Params = state["global"]
        trained = self.train_local(
            member_params(state["personal"], members),
            members,
            silos,
            context,
            anchors=[{name: v[r] for name, v in mean.items()} for r, _ in members],
            strength=self.strength,
        )
        personal = restack([t.params for t in trained], context.trials, len(silos))
        message = payload_bytes(Encoding.FLOAT32, sum(v[0].numel() for v in mean.values()))
        for r, k in members:
            context.traffic(r, k, message, message)  # receives w̄, sends w_k
        weights = torch.tensor(
            [float(s.declared_size) if self.weighting == "size" else 1.0 for s in silos]
        )
        return {
            "global": {
                name: aggregators.weighted_mean(v.flatten(2), weights).reshape(mean[name].shape)
                for name, v in personal.items()
            },
            "personal": personal,
        }
