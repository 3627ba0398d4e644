"""FedAvg with local DP-SGD: FL-STANDARD-DP (Kerkouche Alg. 5) and Dopamine's FPDP.

Each round the server sends the global model to the round's silos (all of them, a
Poisson sample at rate C, or K of N); each runs `local_epochs` epochs of Poisson DP-SGD
(steps = epochs × n_k / B) and returns its model; the server averages them, weighted by
silo size (FedAvg) or uniformly (Kerkouche's 1/|K|). A silo is charged for the rounds it
takes part in: the participation pattern is drawn by the server without looking at any
data, so accounting for the realised pattern is exact for it (docs/privacy.md).
Sizes (steps, weights) are the silos' public sizes, never their true record counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from dpfl.federation import aggregators
from dpfl.federation.algorithms.base import DPSGDAlgorithm, RoundContext, State
from dpfl.federation.client_sampling import ClientSampler
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params


@dataclass(frozen=True)
class FedAvg(DPSGDAlgorithm):
    local_epochs: float = 1.0
    client_rate: float | None = None
    clients_per_round: int | None = None
    weighting: Literal["size", "uniform"] = "size"
    robust: Callable[[Tensor], Tensor] | None = None
    """A robust aggregator of the [K, P] model updates (e.g. `aggregators.coordinate_median`
    or `functools.partial(aggregators.trimmed_mean, trim_fraction=0.2)`), used instead of
    the weighted mean so one bad client moves the model less; post-processing, no ε."""

    name = "fedavg"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_epochs <= 0:
            raise ValueError(f"local_epochs must be > 0, got {self.local_epochs}")
        if self.weighting not in ("size", "uniform"):
            raise ValueError(f"weighting must be 'size' or 'uniform', got {self.weighting!r}")

    def local_steps(self, silo: Silo) -> int:
        return max(1, round(self.local_epochs / self.sample_rate(silo)))

    def client_sampler(self, n_silos: int) -> ClientSampler | None:
        if self.client_rate is None and self.clients_per_round is None:
            return None
        return ClientSampler(n_silos, rate=self.client_rate, per_round=self.clients_per_round)

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        return {"global": self.initial_global(trials)}

    def local_round(
        self, state: State, silos: Sequence[Silo], context: RoundContext
    ) -> tuple[list[tuple[int, int]], list[Params], list[Params]]:
        """The round's (trial, silo) members, the global model each started from, and
        what each trained (charged): the client side shared by FedAvg and FL-SIGN."""
        sampler = self.client_sampler(len(silos))
        glob: Params = state["global"]
        members = [
            (r, int(k))
            for r in range(context.trials)
            for k in (
                np.arange(len(silos)) if sampler is None else sampler.sample(context.rng(r, -1))
            )
        ]
        starts = [{name: v[r] for name, v in glob.items()} for r, _ in members]
        return members, starts, self.train(starts, members, silos, context)

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        glob: Params = state["global"]
        members, _, trained = self.local_round(state, silos, context)
        n_params = sum(v[0].numel() for v in glob.values())
        message = payload_bytes(Encoding.FLOAT32, n_params)
        for r, k in members:
            context.traffic(r, k, message, message)
        new_global = {name: v.clone() for name, v in glob.items()}
        for r in range(context.trials):
            mine = [i for i, (t, _) in enumerate(members) if t == r]
            if not mine:  # nobody sampled: the model stays
                continue
            weights = torch.tensor(
                [
                    float(silos[members[i][1]].declared_size) if self.weighting == "size" else 1.0
                    for i in mine
                ]
            )
            for name in new_global:
                start = glob[name][r]
                updates = torch.stack([(trained[i][name] - start).flatten() for i in mine])
                step = (
                    aggregators.weighted_mean(updates, weights)
                    if self.robust is None
                    else self.robust(updates)
                )
                new_global[name][r] = start + step.reshape(start.shape)
        return {"global": new_global}
