"""FL-SIGN and FL-SIGN-DP (Kerkouche et al., CHIL 2021, Alg. 3 and 4).

As FedAvg (Alg. 1 / 5), the round's silos run local SGD (DP-SGD for FL-SIGN-DP) from the
global model, but each returns only s_k = sign(w_k − w) ∈ {−1, 1}ⁿ, a uniformly random
sign where the update is exactly zero (§3.1), packed one bit a parameter: 32× less
upstream traffic. The server moves the model by γ·sign(Σ_k s_k), a majority vote that is
not weighted by silo size (a client could otherwise inflate its vote by claiming more
records). The sign and the tie-breaking coin are post-processing of the DP-SGD output, so
a silo's charge is its local DP-SGD steps, for the rounds it takes part in, as in FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from dpfl.federation import aggregators
from dpfl.federation.algorithms.base import RoundContext, State
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params


def random_signs(update: Tensor, rng: np.random.Generator) -> Tensor:
    """sign(update) with exact zeros replaced by ±1 with probability 1/2 each (§3.1), so
    that every entry is one bit on the wire."""
    signs = torch.sign(update)
    zeros = signs == 0
    coins = rng.integers(0, 2, size=int(zeros.sum()))
    signs[zeros] = torch.from_numpy(2.0 * coins - 1.0).to(signs.dtype)
    return signs


@dataclass(frozen=True)
class Sign(FedAvg):
    """FL-SIGN (σ = 0) or FL-SIGN-DP; `server_learning_rate` is Kerkouche's γ
    (0.001 for FL-SIGN, 0.005 for FL-SIGN-DP in their Table 5)."""

    server_learning_rate: float = 0.005
    weighting: Literal["size", "uniform"] = "uniform"

    name = "sign"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.server_learning_rate <= 0:
            raise ValueError(f"server_learning_rate must be > 0, got {self.server_learning_rate}")
        if self.weighting != "uniform":
            raise ValueError("FL-SIGN's votes are not weighted by silo size (Kerkouche §3.1)")

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        glob: Params = state["global"]
        members, starts, trained = self.local_round(state, silos, context)
        names = list(glob)
        n_params = sum(glob[name][0].numel() for name in names)
        down, up = payload_bytes(Encoding.FLOAT32, n_params), payload_bytes(Encoding.SIGN, n_params)
        votes = []
        for (r, k), start, local in zip(members, starts, trained, strict=True):
            update = torch.cat([(local[name] - start[name]).flatten() for name in names])
            # a fresh stream: reusing the sampler's would tie the coins to the batches
            votes.append(random_signs(update, context.rng(r, k)))
            context.traffic(r, k, down, up)
        new_global = {name: v.clone() for name, v in glob.items()}
        for r in range(context.trials):
            mine = [votes[i] for i, (t, _) in enumerate(members) if t == r]
            if not mine:  # nobody sampled: the model stays
                continue
            step = self.server_learning_rate * aggregators.sign_majority(torch.stack(mine))
            offset = 0
            for name in names:
                size = new_global[name][r].numel()
                new_global[name][r] += step[offset : offset + size].reshape(
                    new_global[name][r].shape
                )
                offset += size
        return {"global": new_global}
